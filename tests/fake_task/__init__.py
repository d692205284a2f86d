"""A tiny task for tests: the asset is text, its metric the number of words in it (lower is better).

It keeps the evaluator contract of runner.tasks in a few lines, so the isolated run, the protocol,
program.md and the CLI can be tested on a task other than training without Q's or R's evaluators:
`prepare` writes one small file in the cache and returns its sha256, `fingerprint` finds it or
raises DataMissing, and `evaluate` counts words. Words in the asset steer it: REJECT fails the gate,
CRASH makes the asset's run crash, BROKEN makes the evaluator itself raise (a broken machine).

Registered only in tests, by `register(monkeypatch)` in a test's fixture (tests/conftest.py adds
tests/ to sys.path, so this package imports as `fake_task`): FAKE is in runner.tasks.TASKS for that
test only, with its cache in a fresh directory. Its starter files (words.txt, program.md) lie in
this package's directory, as a bundled task's do in its own.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from runner.data import DataMissing, cache_dir
from runner.tasks import TASKS, Evaluation, Metric, Task

FAKE = Task(
    name="word-count",
    asset="words.txt",
    metric=Metric("words", "words", "lower", digits=1),
    evaluator="fake_task",
    summary="say it in fewer words; the number of words",
)


PROFILES = ("smoke", "cpu")  # the profiles it measures under (runner.tasks)


def register(monkeypatch: pytest.MonkeyPatch, cache: Path) -> Task:
    """FAKE in the registry, and the cache at `cache`, until the test ends."""
    monkeypatch.setitem(TASKS, FAKE.name, FAKE)
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    return FAKE


def inputs(profile: str) -> Path:
    return cache_dir() / "word-count" / profile / "inputs.txt"


def prepare(profile: str, *, progress: bool = False) -> str:
    path = inputs(profile)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"the fixed inputs of the {profile} profile\n")
    return fingerprint(profile)


def fingerprint(profile: str) -> str:
    path = inputs(profile)
    if not path.exists():
        raise DataMissing(
            f"the word-count task's {profile} inputs are not prepared: "
            f"run `autoresearch prepare --task word-count --profile {profile}` first"
        )
    return hashlib.sha256(path.read_bytes()).hexdigest()


def evaluate(asset: str, profile: str, seed: int, workdir: Path) -> Evaluation:
    if "BROKEN" in asset:
        raise RuntimeError("the evaluator's machine is broken")
    (workdir / "seen.txt").write_text(asset)
    if "REJECT" in asset:
        return Evaluation("rejected", error="the asset says REJECT, which the gate refuses", sandboxed=True)
    if "CRASH" in asset:
        return Evaluation("crash", error="the asset crashed", log_tail="Traceback: CRASH\n", sandboxed=True)
    words = len(asset.split())
    return Evaluation(
        "ok",
        value=float(words),
        metrics={"characters": len(asset), "seed": seed},
        setup_s=0.01,
        evaluation_s=0.02,
        sandboxed=True,
        log_tail=f"counted {words} words\n",
    )
