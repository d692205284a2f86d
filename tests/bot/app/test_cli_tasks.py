"""The `autoresearch` command on a task other than training (the word-count task of
tests/fake_task): prepare --task, run --task (and its old name, train), demo --task."""

from __future__ import annotations

import json
from pathlib import Path

import fake_task
import pytest
from rich.console import Console
from typer.testing import CliRunner

from bot.app.cli import app
from bot.app.demo import render_summary, seed_files
from bot.loop.conductor import Summary
from runner.tasks import TICKET_ROUTING

cli = CliRunner()
STARTER = (Path(fake_task.__file__).parent / "words.txt").read_text()


def said(result) -> str:
    return " ".join(result.output.split())


@pytest.fixture
def word_count(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    return fake_task.register(monkeypatch, tmp_path / "cache")


def test_prepare_a_task_makes_its_inputs_once(word_count) -> None:
    first = cli.invoke(app, ["prepare", "--task", "word-count", "--profile", "smoke"])
    assert first.exit_code == 0, first.output
    assert f"fingerprint {fake_task.fingerprint('smoke')}" in said(first)
    assert cli.invoke(app, ["prepare", "--task", "word-count", "--profile", "smoke"]).exit_code == 0


def test_prepare_an_unknown_task_names_the_choices() -> None:
    result = cli.invoke(app, ["prepare", "--task", "sorting", "--profile", "smoke"])
    assert result.exit_code == 2 and "unknown task 'sorting'" in said(result) and "training" in said(result)


def test_prepare_ticket_routing_on_a_csv_the_user_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    own = tmp_path / "own.csv"  # written here: two queues of five invented tickets
    own.write_text(
        "text,queue\n" + "".join(f"ticket {n} for {q},{q}\n" for q in ("refund", "lost_card") for n in range(5))
    )
    result = cli.invoke(app, ["prepare", "--task", "ticket-routing", "--profile", "smoke", "--data", str(own)])
    assert result.exit_code == 0, result.output
    assert "ticket-routing: the smoke profile's inputs are ready (fingerprint" in said(result)
    own.write_text("text,queue\nonly one,refund\n")
    refused = cli.invoke(app, ["prepare", "--task", "ticket-routing", "--profile", "smoke", "--data", str(own)])
    assert refused.exit_code == 2 and "only the queue 'refund'" in said(refused)


def test_prepare_refuses_a_profile_or_data_source_the_task_has_not(word_count) -> None:
    result = cli.invoke(app, ["prepare", "--task", "query-latency", "--profile", "h100"])
    assert result.exit_code == 2 and "the query-latency task has no h100 profile" in said(result)
    assert "it measures under smoke or cpu" in said(result)
    result = cli.invoke(app, ["prepare", "--task", "word-count", "--profile", "smoke", "--data", "tickets.csv"])
    assert result.exit_code == 2 and "the word-count task takes no data source (--data)" in said(result)


@pytest.mark.parametrize("command", ["run", "train"])
def test_run_measures_a_tasks_asset_once(word_count, tmp_path: Path, command: str) -> None:
    fake_task.prepare("smoke")
    asset = tmp_path / "words.txt"
    asset.write_text("one two three four\n")
    out = tmp_path / "run"
    args = [command, "--task", "word-count", "--profile", "smoke", "--asset", str(asset), "--out", str(out)]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "words: 4.000000" in said(result)
    assert "words 4.0 words, lower is better" in said(result) and "sandboxed" in said(result)
    assert json.loads((out / "result.json").read_text())["value"] == 4.0


def test_run_of_a_rejected_asset_says_why_and_fails(word_count, tmp_path: Path) -> None:
    fake_task.prepare("smoke")
    asset = tmp_path / "words.txt"
    asset.write_text("REJECT\n")
    args = ["run", "--task", "word-count", "--profile", "smoke", "--asset", str(asset), "--out", str(tmp_path / "r")]
    result = cli.invoke(app, args)
    assert result.exit_code == 1 and "rejected: the asset says REJECT" in said(result)


def test_run_without_prepared_inputs_says_which_prepare_to_run(word_count, tmp_path: Path) -> None:
    asset = tmp_path / "words.txt"
    asset.write_text("one\n")
    args = ["run", "--task", "word-count", "--profile", "smoke", "--asset", str(asset), "--out", str(tmp_path / "r")]
    result = cli.invoke(app, [*args, "--json"])
    assert result.exit_code == 1
    assert "autoresearch prepare --task word-count --profile smoke" in json.loads(result.stdout)["error"]


@pytest.mark.parametrize(("task", "fraction"), [("word-count", "0.5"), ("training", "1.5"), ("training", "0")])
def test_run_refuses_a_budget_fraction_it_cannot_train_saying_what_to_give(
    word_count, tmp_path: Path, task: str, fraction: str
) -> None:
    asset = tmp_path / "asset.txt"
    asset.write_text("one\n")
    args = ["run", "--task", task, "--profile", "smoke", "--asset", str(asset), "--budget-fraction", fraction]
    result = cli.invoke(app, [*args, "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and f"--budget-fraction {float(fraction):g}: give a share" in said(result)
    assert "only training has a budget to shorten" in said(result) and not (tmp_path / "r").exists()


def test_run_defaults_to_the_tasks_asset(word_count, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = cli.invoke(app, ["run", "--task", "word-count", "--profile", "smoke"])
    assert result.exit_code == 2 and "words.txt does not exist" in said(result)


def test_a_task_seeds_the_research_repository_from_its_starter_files(word_count) -> None:
    files = seed_files("word-count")
    assert files["words.txt"] == STARTER
    assert "task: word-count" in files["program.md"]


def test_demo_of_a_task_with_the_offline_explorer_is_refused_before_anything_is_made(
    word_count, tmp_path: Path
) -> None:
    work = tmp_path / "demo"
    result = cli.invoke(app, ["demo", "--task", "word-count", "--workdir", str(work), "--profile", "smoke"])
    assert result.exit_code == 2 and "has nothing to tune" in said(result) and "--agent scripted" in said(result)
    assert not work.exists()


def test_demo_of_another_task_in_a_work_directory_is_refused(word_count, tmp_path: Path) -> None:
    """A work directory's repository holds one task: the one its main's program.md names."""
    from bot.forge.local import init_research_repo

    work = tmp_path / "demo"
    init_research_repo(work / "repo", seed_files("word-count"))
    script = tmp_path / "proposals.jsonl"
    script.write_text("")
    args = ["demo", "--workdir", str(work), "--profile", "smoke", "--agent", "scripted", "--agent-script", str(script)]
    result = cli.invoke(app, args)
    assert result.exit_code == 1
    assert "holds the word-count task" in said(result) and "use --task word-count here" in said(result)


@pytest.mark.parametrize("task", ["training", "ticket-routing", "query-latency"])
def test_the_offline_explorer_is_taken_for_every_bundled_task(task: str) -> None:
    from bot.app.demo import check_agent_for_task

    check_agent_for_task("explorer", task)  # constants of train.py and router.py, indexes of query.sql


def test_the_demos_summary_speaks_the_tasks_metric_on_its_own_scale() -> None:
    """The conductor's summary holds losses: accuracy's are negated back for people."""
    summary = Summary(
        experiments=2,
        kept=1,
        discarded=1,
        crashed=0,
        failed=0,
        baseline_val_bpb=-0.8,
        best_val_bpb=-0.85,
        stop_reason="done",
    )
    console = Console(width=120, record=True)
    console.print(render_summary(summary, 1.0, Path("results.tsv"), TICKET_ROUTING.metric))
    rows = [" ".join(line.replace("│", " ").split()) for line in console.export_text().splitlines()]
    assert "baseline accuracy 0.800000" in rows and "main's accuracy now (its own runs) 0.850000" in rows


def test_the_service_refuses_a_task_on_a_profile_it_has_not_before_it_makes_a_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.app.serve import default_parts
    from bot.app.settings import ServiceSettings

    monkeypatch.chdir(tmp_path)  # no .env
    settings = ServiceSettings(
        _env_file=None,
        repository="o/r",
        github_token="t",
        webhook_secret="s",
        profile="h100",
        runner="modal",
        data_fingerprint="d" * 16,
    )
    with pytest.raises(ValueError, match="the query-latency task has no h100 profile .*smoke or cpu"):
        default_parts(settings, client=None, task="query-latency")  # type: ignore[arg-type]
