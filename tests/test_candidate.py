"""executor/candidate.py: exactly one knob changed on a real Megatron command line."""

from __future__ import annotations

import pytest
from moetune.executor.candidate import (
    Launch,
    apply,
    current_value,
    diff,
    parse_change,
    split_command,
)

from moetune.errors import UserError

CMD = ("torchrun --nproc-per-node 8 pretrain_gpt.py --micro-batch-size 1 --enable-cuda-graph "
       "--recompute-granularity selective --recompute-modules core_attn mlp --bf16 --data-path x")


def base() -> Launch:
    return Launch(split_command(CMD))


@pytest.mark.parametrize(
    ("change", "removed", "added"),
    [
        ("micro_batch_size=4", ["1"], ["4"]),
        ("--micro-batch-size=2", ["1"], ["2"]),
        ("moe_grouped_gemm=true", [], ["--moe-grouped-gemm"]),
        # deprecated alias replaced by the current spelling (rules/knobs.yaml deprecated_flags)
        ("cuda_graph_impl=local", ["--enable-cuda-graph"], ["--cuda-graph-impl", "local"]),
        ("recompute_modules=moe_act", ["core_attn", "mlp"], ["moe_act"]),
        ("bf16=false", ["--bf16"], []),
        ("overlap_p2p_comm=false", [], ["--no-overlap-p2p-communication"]),
    ],
)
def test_apply_one_change(change: str, removed: list[str], added: list[str]) -> None:
    b = base()
    ch = parse_change(change)
    c = apply(b, ch)
    d = diff(b, c)
    assert (d["removed"], d["added"], d["env"]) == (removed, added, {})
    assert b == base()  # input untouched
    assert c.argv[:4] == ("torchrun", "--nproc-per-node", "8", "pretrain_gpt.py")
    i = c.argv.index("--data-path")
    assert c.argv[i + 1] == "x"  # a flag's value stays with its flag


def test_env_knob_and_current_value() -> None:
    c = apply(base(), parse_change("CUDA_DEVICE_MAX_CONNECTIONS=1"))
    assert c.argv == base().argv and c.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    ch = parse_change("recompute_modules=moe_act,layernorm")
    assert current_value(apply(base(), ch), ch.knob) == ["moe_act", "layernorm"]
    assert current_value(base(), parse_change("micro_batch_size=9").knob) == 1


@pytest.mark.parametrize("bad", ["micro_batch_size", "micro_batch_size=four", "moe_grouped_gemm=maybe",
                                 "moe_token_dispatcher_type=carrier-pigeon", "Bad Name=1"])
def test_bad_changes_are_user_errors(bad: str) -> None:
    with pytest.raises(UserError):
        parse_change(bad)
