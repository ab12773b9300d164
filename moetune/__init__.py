"""moetune: diagnose, audit and tune slow MoE training runs (Megatron-Core) from their traces."""

__version__ = "0.1.0"
