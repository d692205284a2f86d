"""Shared fixtures, made once per test session: a private data/tokenizer cache, the smoke profile
prepared in it, and a warm scorer (runner.score's Scorer, ready) for tests that score exported
models in this process."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/fakes.py: `import fakes`


@pytest.fixture(scope="session")
def autoresearch_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """AUTORESEARCH_CACHE points at a fresh directory for the whole session (child processes
    inherit it); the previous value comes back afterwards."""
    root = tmp_path_factory.mktemp("autoresearch-cache")
    previous = os.environ.get("AUTORESEARCH_CACHE")
    os.environ["AUTORESEARCH_CACHE"] = str(root)
    try:
        yield root
    finally:
        if previous is None:
            os.environ.pop("AUTORESEARCH_CACHE", None)
        else:
            os.environ["AUTORESEARCH_CACHE"] = previous


@pytest.fixture(scope="session")
def smoke_prepared(autoresearch_cache: Path):
    """The `smoke` profile's data and tokenizer, prepared once in the session cache."""
    from runner.prepare import prepare

    return prepare("smoke")


@pytest.fixture(scope="session")
def warm_scorer(smoke_prepared):
    """The scoring process's Scorer for the smoke profile, made once: torch, the validation split,
    the tokenizer and the probe's batch loaded. `warm_scorer.score(path)` answers as the scoring
    process of an isolated run would for the exported model at `path`."""
    from runner.score import Scorer

    return Scorer("smoke")
