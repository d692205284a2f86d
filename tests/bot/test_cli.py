"""The `autoresearch` command as a person uses it: prepare, train, demo (and its resume), results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot.cli import app

ROOT = Path(__file__).resolve().parents[2]
cli = CliRunner()


def said(result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def test_prepare_twice_does_no_work_the_second_time(smoke_prepared) -> None:
    result = cli.invoke(app, ["prepare", "--profile", "smoke"])
    assert result.exit_code == 0, result.output
    assert "already cached" in said(result)


def test_unknown_profile_is_a_clear_error() -> None:
    result = cli.invoke(app, ["prepare", "--profile", "tpu"])
    assert result.exit_code == 2
    assert "unknown profile 'tpu'" in said(result) and "smoke" in said(result)


@pytest.mark.slow
def test_train_prints_the_summary_and_fails_loudly(tmp_path: Path, smoke_prepared) -> None:
    ok = cli.invoke(app, ["train", "--profile", "smoke", "--asset", str(ROOT / "train.py"),
                          "--out", str(tmp_path / "ok")])
    assert ok.exit_code == 0, ok.output
    result = json.loads((tmp_path / "ok" / "result.json").read_text())
    assert result["status"] == "ok"

    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('this train.py is broken')\n")
    failed = cli.invoke(app, ["train", "--profile", "smoke", "--asset", str(broken), "--out", str(tmp_path / "bad")])
    assert failed.exit_code == 1
    assert "run failed" in said(failed) and "broken" in said(failed)


@pytest.mark.slow
def test_demo_runs_then_resumes_to_a_larger_target(tmp_path: Path, smoke_prepared) -> None:
    work = tmp_path / "demo"
    first = cli.invoke(app, ["demo", "--workdir", str(work), "--profile", "smoke", "--experiments", "1"])
    assert first.exit_code == 0, first.output
    assert "reached 1 experiments" in said(first) and "results.tsv" in said(first)

    again = cli.invoke(app, ["demo", "--workdir", str(work), "--profile", "smoke", "--experiments", "2"])
    assert again.exit_code == 0, again.output
    rows = json.loads(cli.invoke(app, ["results", "--workdir", str(work), "--json"]).output)
    assert [row["id"] for row in rows] == [0, 1, 2]  # the baseline, then the two experiments
    tsv = cli.invoke(app, ["results", "--workdir", str(work), "--tsv"]).output.splitlines()
    assert len(tsv) == 1 + 3
    table = cli.invoke(app, ["results", "--workdir", str(work)])
    assert table.exit_code == 0 and "baseline" in said(table)


def test_results_without_a_demo_says_what_to_run(tmp_path: Path) -> None:
    result = cli.invoke(app, ["results", "--workdir", str(tmp_path)])
    assert result.exit_code == 2
    assert "autoresearch demo" in said(result)


def test_demo_with_bad_front_matter_stops_with_a_clear_error_and_loses_nothing(tmp_path: Path, smoke_prepared) -> None:
    from bot.forge.local import init_research_repo

    work = tmp_path / "demo"
    train_py = (ROOT / "train.py").read_text()
    init_research_repo(work / "repo", {"train.py": train_py,
                                       "program.md": "---\nautoresearch:\n  baseline_runs: 0\n---\nhi\n"})
    result = cli.invoke(app, ["demo", "--workdir", str(work), "--profile", "smoke", "--experiments", "1"])
    assert result.exit_code == 1
    assert "autoresearch.baseline_runs" in said(result) and "run the same command again" in said(result)
    assert (work / "repo" / "train.py").read_text() == train_py


def test_a_second_conductor_on_the_same_workdir_is_refused(tmp_path: Path) -> None:
    from bot.demo import lock_workdir

    held = lock_workdir(tmp_path)
    try:
        result = cli.invoke(app, ["demo", "--workdir", str(tmp_path), "--profile", "smoke"])
    finally:
        held.close()
    assert result.exit_code == 1
    assert "another autoresearch conductor is running" in said(result)
