"""Each bundled task other than training end to end through the command, on real runs: `autoresearch
demo --task query-latency|ticket-routing --profile smoke` with the offline explorer, then results,
status and plot over its work directory.

Real evaluations decide the experiments (p95 latency and a router's accuracy over seeds both wobble),
so only what is sure is asserted: the demo ends having run its experiments, results.tsv names the
task's metric and has one row per experiment, main moved only through merges of experiments the
store says were kept by a measured gain (consistency, not that a keep happened), the chart is
written with the metric's label, and nothing the person reads says val_bpb or train.py. The loop
on chosen outcomes is tests/bot/app/test_cli.py's; each task's evaluator is tested in tests/runner.
Each demo is 6 runs of main and 3 experiments at smoke, about 15-25 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot.app.cli import app
from runner.tasks import QUERY_LATENCY, TICKET_ROUTING, Task

cli = CliRunner()
EXPERIMENTS = 3


def said(result) -> str:
    return " ".join(result.output.split())


@pytest.mark.parametrize("task", [QUERY_LATENCY, TICKET_ROUTING], ids=lambda t: t.name)
def test_a_tasks_demo_runs_its_experiments_and_speaks_its_metric(
    task: Task, tmp_path: Path, autoresearch_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    work = tmp_path / "demo"
    args = ["--task", task.name, "--profile", "smoke", "--experiments", str(EXPERIMENTS)]
    demo = cli.invoke(app, ["demo", "--workdir", str(work), "--no-dashboard", *args])
    assert demo.exit_code == 0, demo.output
    assert f"reached {EXPERIMENTS} experiments" in said(demo)
    assert f"baseline {task.metric.name}" in said(demo)

    metric = task.metric.name
    tsv = (work / "results.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:2] == ["commit", metric]
    assert len(tsv) == 1 + 1 + EXPERIMENTS  # the header, main's first row, one row per experiment
    check_main_moved_only_by_measured_keeps(work, task)

    chart = work / "progress.svg"
    plot = cli.invoke(app, ["plot", "--workdir", str(work), "--out", str(chart)])
    assert plot.exit_code == 0, plot.output
    assert f"{metric} ({task.metric.unit})" in chart.read_text()

    shown = [demo.output, plot.output, "\n".join(tsv), chart.read_text(), (work / "conductor.log").read_text()]
    for command in (["results"], ["results", "--runs"], ["status"]):
        result = cli.invoke(app, [*command, "--workdir", str(work)])
        assert result.exit_code == 0, result.output
        shown.append(result.output)
    assert metric in shown[-3]
    for text in shown:
        assert "val_bpb" not in text and "train.py" not in text


def check_main_moved_only_by_measured_keeps(work: Path, task: Task) -> None:
    """Main's history is its first commit and then one merge per kept experiment, in order, each the
    asset its experiment measured; each kept experiment beat main by more than its recorded margin (or
    was kept for simplicity, within the loss its runs ruled out); every experiment is done, with a row
    in results.tsv."""
    from bot.core.records import code_hash
    from bot.forge.local import LocalForge
    from bot.store import Store

    forge, store = LocalForge(work / "repo"), Store(work / "state.db")
    try:
        experiments = store.experiments.all()
        runs = store.runs.all()
    finally:
        store.close()
    assert len(experiments) == EXPERIMENTS and all(e.state == "done" for e in experiments)
    history = list(forge.repo.iter_commits("main", first_parent=True))
    kept = [e for e in experiments if e.status == "keep"]
    assert [c.hexsha for c in reversed(history[:-1])] == [e.merged_sha for e in kept]
    for commit, exp in zip(reversed(history[:-1]), kept, strict=True):
        assert f"autoresearch-experiment: {exp.id}" in commit.message
        merged = code_hash((commit.tree / task.asset).data_stream.read().decode())
        assert [r for r in runs if r.experiment_id == exp.id and r.code_hash == merged and r.status == "ok"]
        assert exp.delta is not None and exp.margin is not None
        if "kept_for_simplicity" in exp.meta:
            assert exp.delta < exp.meta["kept_for_simplicity"]["loss_margin"]
        else:
            assert exp.delta < -exp.margin
    statuses = [line.split("\t")[3] for line in (work / "results.tsv").read_text().splitlines()[1:]]
    assert statuses == ["keep"] + [e.status for e in experiments]
