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


def read_user_text(path: str | Path, *, errors: str = "strict") -> str:
    """A user's file as text, or one `UserError` line naming it (missing, unreadable, not UTF-8)."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8", errors=errors)
    except FileNotFoundError:
        raise UserError("no such file", path=p) from None
    except IsADirectoryError:
        raise UserError("is a directory, not a file", path=p) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read: {getattr(exc, 'strerror', None) or exc}", path=p) from None


class GateFailed(Exception):
    """A check the user asked for failed (e.g. an audit found a contradicted claim): exit code 1."""

    exit_code = 1


class GateUndecided(GateFailed):
    """A check the user asked for could not be decided from the input (e.g. `diff
    --fail-if-slower` with a run's noise unknown, an audit that could check no claim): exit code
    3, so that a CI job tells "cannot say" from "passed" (0) and "failed" (1)."""

    exit_code = 3
