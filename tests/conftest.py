"""Shared test fixtures: where the public corpus and the project's own fixtures live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
# CI and development keep the corpus (public HTA, nsys-ai and TraceLens test traces) in a folder
# beside the checkout; MOETUNE_CORPUS points elsewhere.
CORPUS = Path(os.environ.get("MOETUNE_CORPUS", ROOT.parent / "shared" / "corpus"))


@pytest.fixture(scope="session")
def corpus() -> Path:
    """The public trace corpus (`CORPUS`); tests that need it skip cleanly without it."""
    if not (CORPUS / "public").is_dir():
        pytest.skip(f"public corpus not found at {CORPUS}")
    return CORPUS


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the golden documents (tests/golden.py) instead of comparing")


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The changed fields of every golden document that differed, grouped across documents: a
    rule added to the catalog reads as one line, not one failure per document to eyeball."""
    from tests import golden

    lines = golden.summary()
    if lines:
        terminalreporter.section("golden documents")
        for line in lines:
            terminalreporter.write_line(line)
