"""Where moetune's own data files are: through importlib.resources, so they are found the same way
from a wheel, an editable install or a source tree (a leaf module: it imports nothing of moetune)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def data(package: str, *parts: str) -> Path:
    """A file or folder shipped inside `package` (e.g. `data("moetune.rules", "knobs.yaml")`)."""
    return Path(str(files(package).joinpath(*parts)))


def schema(name: str) -> Path:
    """The JSON Schema file `schemas/<name>.schema.json`."""
    return data("moetune.schemas", f"{name}.schema.json")


DEMO_TRACE = "mcore_hostbound.pt.trace.json.gz"


def demo_trace() -> Path:
    """The small real H200 Megatron-Core trace `moetune diagnose` reads when given no path."""
    return data("moetune", "data", DEMO_TRACE)

