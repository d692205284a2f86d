"""bench/task_demo.py's reading of a demo's work directory, on a store and repository written by
hand: no demo runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import benches
import pytest

from bot.store import Store

bench = benches.load("task_demo")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, name: str) -> str:
    (repo / "router.py").write_text(f"# {name}\n")
    git(repo, "add", "router.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", name)
    return git(repo, "rev-parse", "HEAD")


def finish(store: Store, *, experiment_id: int | None, code: str, sha: str, accuracy: float) -> None:
    run = store.runs.add(
        experiment_id=experiment_id,
        purpose="baseline" if experiment_id is None else "candidate",
        code_hash=code,
        commit_sha=sha,
        base_sha=sha,
        asset="router.py",
        profile="cpu",
    )
    store.runs.finish(run.id, status="ok", val_bpb=-accuracy, metrics={}, error=None, log_tail=None)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A ticket-routing demo: main measured under seeds 1-3, one experiment kept under seeds 1-2 and
    merged, the new main measured afresh under seeds 1-2 (the same values, as a deterministic
    evaluator gives), then a commit on main that no experiment made; and one run of the experiment
    rejected, without a value."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    first = commit(repo, "initial")
    merged = commit(repo, "lower ALPHA")
    commit(repo, "a person's edit")
    (tmp_path / "results.tsv").write_text("commit\taccuracy\n")
    store = Store(tmp_path / "state.db")
    store.state.identity = {"task": "ticket-routing"}
    for accuracy in (0.80, 0.82, 0.81):
        finish(store, experiment_id=None, code="main-1", sha=first, accuracy=accuracy)
    store.db.execute(
        "INSERT INTO experiments(state, status, title, base_sha, merged_sha, delta, margin, remeasured_delta,"
        " reason, created_at, updated_at) VALUES ('done', 'keep', 'lower ALPHA', ?, ?, -0.04, 0.02, -0.04, 'kept', 0, 0)",
        (first, merged),
    )
    store.db.commit()
    for accuracy in (0.84, 0.86):
        finish(store, experiment_id=1, code="exp-1", sha="e" * 40, accuracy=accuracy)
        finish(store, experiment_id=None, code="main-2", sha=merged, accuracy=accuracy)
    rejected = store.runs.add(
        experiment_id=1,
        purpose="candidate",
        code_hash="exp-1",
        commit_sha="e" * 40,
        base_sha=first,
        asset="",
        profile="cpu",
    )
    store.runs.finish(
        rejected.id, status="crash", val_bpb=None, metrics={}, error="rejected: other rows", log_tail=None
    )
    store.close()
    return tmp_path


def test_the_report_speaks_the_tasks_metric_with_gains_positive(workdir: Path) -> None:
    found = bench.report(workdir)
    assert found["task"] == "ticket-routing" and found["metric"].name == "accuracy"
    (kept,) = found["experiments"]
    assert kept["mean"] == pytest.approx(0.85)
    assert kept["gain"] == pytest.approx(0.04) and kept["margin"] == pytest.approx(0.02)
    assert kept["paired_gains"] == {1: pytest.approx(0.04), 2: pytest.approx(0.04)}
    assert [round(v, 2) for v in found["mains"][git(workdir / "repo", "rev-parse", "main~2")].values()] == [
        0.80,
        0.82,
        0.81,
    ]


def test_the_new_mains_fresh_runs_that_repeat_the_candidates_are_flagged(workdir: Path) -> None:
    (kept,) = bench.report(workdir)["experiments"]
    assert kept["fresh_runs_repeat_candidate"] == {1: True, 2: True}


def test_each_merge_on_main_is_matched_to_its_experiment_and_checked_for_a_gain(workdir: Path) -> None:
    merges = bench.report(workdir)["merges"]
    assert [(m["experiment"], m["measured_gain"]) for m in merges] == [(1, True), (None, False)]


def test_the_rendering_counts_every_run_per_experiment_and_names_each_merge(workdir: Path) -> None:
    text = bench.render(bench.report(workdir))
    assert (
        "runs 8 (1 without a value): {'baseline': 5, 'candidate': 3, 'confirm': 0, 'remeasure': 0}; 8.00 per experiment"
        in text
    )
    assert "#1 keep: lower ALPHA: 2 run(s), mean 0.8500, gain +0.040000, margin 0.020000" in text
    assert "a gain beyond its margin: True" in text and "experiment None, a gain beyond its margin: False" in text
