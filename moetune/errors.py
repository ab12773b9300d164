"""The one error type users see: a one-line message naming the file and the problem, exit code 2."""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """Bad input or usage. The CLI prints `moetune: <message>` on one line and exits with 2."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else None
        text = f"{self.path}: {message}" if self.path else message
        super().__init__(" ".join(text.split()))  # one line, always

    @property
    def message(self) -> str:
        return str(self)


class GateFailed(Exception):
    """A check the user asked for failed (e.g. an audit found a contradicted claim): exit code 1."""

    exit_code = 1
