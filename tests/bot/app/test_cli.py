"""The `autoresearch` command as a person uses it: prepare, train, demo (and its resume), results."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import IDENTITY, with_effect
from typer.testing import CliRunner

from bot.app.cli import app
from tests.bot.app.instant_runner import InstantRunner

ROOT = Path(__file__).resolve().parents[3]
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


# A train.py that hands over an untrained model at once: the outcome (measured, ok) is certain, with no
# training whose noise could change it. The real train.py takes the same isolated path in
# tests/bot/runners/test_local.py.
UNTRAINED = """
import torch
from runner import harness
h = harness.session()
model = torch.nn.Sequential(torch.nn.Embedding(h.vocab_size, 8), torch.nn.Linear(8, h.vocab_size))
print(h.finish(model).summary_block())
"""
# ... and one that also prints a val_bpb of its own, as a train.py may
LIAR = "print('val_bpb:          0.100000', flush=True)\n" + UNTRAINED


@pytest.fixture(scope="module")
def measured(smoke_prepared, tmp_path_factory: pytest.TempPathFactory):
    """One real `autoresearch train` of LIAR on the smoke profile: (the command's result, its run
    directory). The run is the one every runner makes, sandboxed and scored outside."""
    work = tmp_path_factory.mktemp("train")
    liar = work / "liar.py"
    liar.write_text(LIAR)
    out = work / "run"
    return cli.invoke(app, ["train", "--profile", "smoke", "--asset", str(liar), "--out", str(out)]), out


@pytest.mark.slow
def test_train_measures_like_the_runners(measured) -> None:
    """Slow tier: a real isolated run through the command, its every part real (the fast tier runs
    that path in tests/runner/test_isolated.py, and the command's own part on a fake run in
    test_train_prints_the_scorers_number_once_and_where_the_result_is)."""
    run, out = measured
    assert run.exit_code == 0, run.output
    assert "scored outside the sandbox" in said(run)
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["runner"]["backend"] == "manual" and result["val_bpb"] > 0
    assert f"result: {out / 'result.json'}" in said(run)


@pytest.mark.slow
def test_a_train_py_that_prints_its_own_val_bpb_is_not_what_grep_finds(measured) -> None:
    """Slow tier: the real run of test_train_measures_like_the_runners, its output and its log."""
    # the reference's `grep "^val_bpb:" run.log` finds the scorer's number, once, on stdout and in the log
    run, out = measured
    scored = json.loads((out / "result.json").read_text())["val_bpb"]
    for text in (run.output, (out / "log.txt").read_text()):
        grepped = [line for line in text.splitlines() if line.startswith("val_bpb:")]
        assert grepped == [f"val_bpb:          {scored:.6f}"]
        assert "(train.py printed) val_bpb:          0.100000" in text


class ScoredRun:
    """runner.isolated.run_job for `train` where the command's own part is under test: train.py's
    lines as the supervisor relays them (its own val_bpb marked), then a scored result; the jobs it
    was given are kept."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, Path, dict]] = []

    def __call__(self, job, out: Path, *, on_line, **options):
        from runner.protocol import Hashes, ResultSpec, RunnerIdentity, Timings

        self.calls.append((job, out, options))
        on_line("(train.py printed) val_bpb:          0.100000")
        return ResultSpec(
            run_id=job.run_id,
            status="ok",
            val_bpb=2.345678,
            metrics={"clock": "cpu", "num_steps": 12},
            timings=Timings(training=1.5, evaluation=0.5, total=3.0),
            hashes=Hashes(asset=job.asset_sha256, harness="h", data="d"),
            runner=RunnerIdentity(backend=options["backend"]),
            sandboxed=True,
            profile=job.profile,
        )


def test_train_prints_the_scorers_number_once_and_where_the_result_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scored = ScoredRun()
    monkeypatch.setattr("runner.isolated.run_job", scored)
    asset = tmp_path / "liar.py"
    asset.write_text(LIAR)
    out = tmp_path / "run"
    run = cli.invoke(app, ["train", "--profile", "smoke", "--asset", str(asset), "--out", str(out), "--seed", "3"])
    assert run.exit_code == 0, run.output
    [(job, given_out, options)] = scored.calls
    assert (job.asset, job.profile, job.seed, given_out) == (LIAR, "smoke", 3, out.resolve())
    assert options["backend"] == "manual" and options["use_sandbox"] is None  # sandboxed wherever it can be
    # the reference's `grep "^val_bpb:" run.log` finds the scorer's number, once
    assert [line for line in run.output.splitlines() if line.startswith("val_bpb:")] == ["val_bpb:          2.345678"]
    assert "(train.py printed) val_bpb:          0.100000" in run.output
    assert "val_bpb 2.345678 (scored outside the sandbox: training 1.5s on the cpu clock" in said(run)
    assert "sandboxed)" in said(run) and "NOT sandboxed" not in said(run)
    assert f"result: {out.resolve() / 'result.json'}" in said(run)


class CrashingRun:
    """runner.isolated.run_job for `train` where the CLI's own output is under test: train.py says a
    line, then the run is the crash of a broken train.py (the real one:
    tests/bot/runners/test_local.py::test_a_crash_is_a_result_with_the_error)."""

    def __call__(self, job, out: Path, *, on_line, **options):
        from runner.protocol import Hashes, ResultSpec, RunnerIdentity

        on_line("training output")
        return ResultSpec(
            run_id=job.run_id,
            status="crash",
            error="SystemExit: this train.py is broken",
            hashes=Hashes(asset=job.asset_sha256, harness="h", data="d"),
            runner=RunnerIdentity(backend=options["backend"]),
            profile=job.profile,
        )


def test_train_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("runner.isolated.run_job", CrashingRun())
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('this train.py is broken')\n")
    failed = cli.invoke(app, ["train", "--profile", "smoke", "--asset", str(broken), "--out", str(tmp_path / "bad")])
    assert failed.exit_code == 1
    assert "crash:" in said(failed) and "broken" in said(failed) and "training output" in said(failed)
    assert not [line for line in failed.output.splitlines() if line.startswith("val_bpb:")]  # as the reference


def test_train_json_prints_only_the_result_on_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.protocol import ResultSpec

    monkeypatch.setattr("runner.isolated.run_job", CrashingRun())
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('this train.py is broken')\n")
    failed = cli.invoke(
        app, ["train", "--profile", "smoke", "--asset", str(broken), "--out", str(tmp_path / "bad"), "--json"]
    )
    assert failed.exit_code == 1
    result = ResultSpec.model_validate_json(failed.stdout)  # the whole of stdout is the one object
    assert result.status == "crash" and "broken" in result.error
    assert failed.stderr.startswith("training output") and failed.stdout.count("\n") == 1


def seeded_workdir(work: Path, **settings: object) -> None:
    """A work directory whose research repository measures main twice (a short demo)."""
    from bot.forge.local import init_research_repo

    lines = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in settings.items())
    program = f"---\nautoresearch:\n{lines}\n---\n\n# Research program\n\nLower val_bpb.\n"
    init_research_repo(work / "repo", {"train.py": (ROOT / "train.py").read_text(), "program.md": program})


@pytest.fixture
def instant_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`autoresearch demo` on InstantRunner: nothing to prepare, the fakes' identity measured. The
    demo's log handler on the root logger goes afterwards."""
    monkeypatch.setattr("bot.app.demo.prepare", lambda profile, data, progress: None)
    monkeypatch.setattr("bot.app.demo.LocalRunner", InstantRunner)
    monkeypatch.setattr("bot.app.demo.measurement_identity", lambda profile, data, threads: dict(IDENTITY))
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


def test_demo_runs_then_resumes_to_a_larger_target(tmp_path: Path, instant_runs: None) -> None:
    """The loop end to end through the command, on runs whose outcomes the test chose: the first
    demo keeps a better train.py, the same command with a larger target resumes and discards a worse
    one. The same on real runs of the real train.py, asserting only what is sure: the slow test
    below."""
    work, script = tmp_path / "demo", tmp_path / "proposals.jsonl"
    seeded_workdir(work, first_baseline_runs=2, baseline_runs=2)
    asset = (ROOT / "train.py").read_text()
    demo = ["demo", "--workdir", str(work), "--profile", "smoke", "--dashboard-port", "0"]
    demo += ["--agent", "scripted", "--agent-script", str(script)]

    script.write_text(json.dumps({"title": "better", "train_py": with_effect(asset, -0.1, "better")}))
    first = cli.invoke(app, [*demo, "--experiments", "1"])
    assert first.exit_code == 0, first.output
    check_the_first_demo(first)
    script.write_text(json.dumps({"title": "worse", "train_py": with_effect(asset, +0.1, "worse")}))
    again = cli.invoke(app, [*demo, "--experiments", "2"])
    assert again.exit_code == 0, again.output
    check_a_resumed_demo(work)

    rows = json.loads(cli.invoke(app, ["results", "--workdir", str(work), "--json"]).output)
    assert [(row["id"], row["status"]) for row in rows] == [(0, "keep"), (1, "keep"), (2, "discard")]
    assert "reached 2 experiments" in said(again)


@pytest.mark.slow
@pytest.mark.parametrize("sandboxing", ["sandboxed", "unsandboxed"])
def test_demo_on_real_runs_resumes_to_a_larger_target(
    tmp_path: Path, smoke_prepared, monkeypatch, sandboxing: str
) -> None:
    """The whole loop end to end, in bubblewrap and without it (a machine without bubblewrap: the
    warm workers' renamed directories once crashed every other run there). Real runs decide the
    experiments, so only what is sure is asserted; the outcomes on chosen ones: the fast test above.
    Slow tier: what is under test is the loop on real runs of the real train.py (main measured twice,
    two experiments, the resume), each a smoke run of seconds."""
    from runner import sandbox

    if sandboxing == "sandboxed" and not sandbox.available()[0]:
        pytest.skip(f"no sandbox here: {sandbox.available()[1]}")
    if sandboxing == "unsandboxed":
        monkeypatch.setenv(sandbox.OFF_SWITCH, "off")

    work = tmp_path / "demo"
    seeded_workdir(work, first_baseline_runs=2, baseline_runs=2)
    first = cli.invoke(app, ["demo", "--workdir", str(work), "--profile", "smoke", "--experiments", "1"])
    assert first.exit_code == 0, first.output
    check_the_first_demo(first)
    again = cli.invoke(app, ["demo", "--workdir", str(work), "--profile", "smoke", "--experiments", "2"])
    assert again.exit_code == 0, again.output
    check_a_resumed_demo(work)
    runs = json.loads(cli.invoke(app, ["results", "--workdir", str(work), "--runs", "--json"]).output)
    assert all(math.isfinite(run["val_bpb"]) and run["val_bpb"] > 0 for run in runs if run["status"] == "ok")


def check_the_first_demo(first) -> None:
    """What `autoresearch demo --experiments 1` says, whatever its runs measured."""
    assert "reached 1 experiments" in said(first) and "results.tsv" in said(first)
    # without a terminal, every event is one printed line
    assert "queued: run 1 (baseline) queued: measure main" in first.output
    assert "#1 proposed:" in first.output


def check_a_resumed_demo(work: Path) -> None:
    """What is sure after a demo of one experiment resumed to two, whatever its runs measured."""
    rows = json.loads(cli.invoke(app, ["results", "--workdir", str(work), "--json"]).output)
    assert [row["id"] for row in rows] == [0, 1, 2]  # the baseline, then the two experiments
    assert all(row["steps"] and row["tokens_per_second"] for row in rows if row["status"] in ("keep", "discard"))
    tsv = cli.invoke(app, ["results", "--workdir", str(work), "--tsv"]).output.splitlines()
    assert len(tsv) == 1 + 3
    table = cli.invoke(app, ["results", "--workdir", str(work)])
    assert table.exit_code == 0 and "baseline" in said(table)
    runs = json.loads(cli.invoke(app, ["results", "--workdir", str(work), "--runs", "--json"]).output)
    assert all(run["steps"] for run in runs if run["status"] == "ok")
    # main's own train.py never crashes, warm worker or not (the agent's changes may); the first main
    # was measured twice (a later main's baseline may still be queued when the demo stops)
    baselines = [run for run in runs if run["purpose"] == "baseline"]
    assert not [run for run in baselines if run["status"] == "crash"], baselines
    assert sum(run["status"] == "ok" and run["state"] == "done" for run in baselines) >= 2, baselines
    status = cli.invoke(app, ["status", "--workdir", str(work)])
    assert status.exit_code == 0 and "profile smoke" in said(status) and "nothing running" in said(status)
    check_the_research_repository(work)


def check_the_research_repository(work: Path) -> None:
    """What is sure after any real run of the loop, whatever the training noise decided."""
    from bot.core.records import code_hash
    from bot.forge.local import LocalForge
    from bot.store import Store

    forge, store = LocalForge(work / "repo"), Store(work / "state.db")
    experiments = store.experiments.all()
    assert all(e.state == "done" for e in experiments)
    # main advanced only through kept experiments, each merge naming its experiment
    history = list(forge.repo.iter_commits("main", first_parent=True))
    kept = [e for e in experiments if e.status == "keep"]
    assert [c.hexsha for c in reversed(history[:-1])] == [e.merged_sha for e in kept]
    for commit, exp in zip(reversed(history[:-1]), kept, strict=True):
        assert f"autoresearch-experiment: {exp.id}" in commit.message
    # every commit of main has a measured val_bpb of its own train.py
    for commit in history:
        text = (commit.tree / "train.py").data_stream.read().decode()
        assert [r for r in store.runs.all(code_hash=code_hash(text)) if r.purpose == "baseline" and r.val_bpb], commit
    # every experiment keeps its branch as a record; results.tsv has the baseline and one row each
    assert set(forge.list_branches()) == {e.branch for e in experiments}
    lines = (work / "results.tsv").read_text().splitlines()
    assert [line.split("\t")[3] for line in lines[1:]] == ["keep"] + [e.status for e in experiments]
    store.close()


def test_results_without_a_demo_says_what_to_run(tmp_path: Path) -> None:
    result = cli.invoke(app, ["results", "--workdir", str(tmp_path)])
    assert result.exit_code == 2
    assert "autoresearch demo" in said(result)


def test_results_refuses_json_and_tsv_together(tmp_path: Path) -> None:
    result = cli.invoke(app, ["results", "--workdir", str(tmp_path), "--json", "--tsv"])
    assert result.exit_code == 2 and "choose one of --json and --tsv" in said(result)


def test_steer_pause_and_resume_go_through_the_inbox(tmp_path: Path) -> None:
    from bot.store import Store

    Store(tmp_path / "state.db").close()
    for args in (["steer", "try a deeper model"], ["pause"], ["resume"]):
        result = cli.invoke(app, [*args, "--workdir", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert "a running loop applies it" in said(result)
    store = Store(tmp_path / "state.db")
    entries = store.inbox.all()
    store.close()
    assert [(e.kind, e.payload) for e in entries] == [
        ("steer", {"text": "try a deeper model"}),
        ("pause", {}),
        ("resume", {}),
    ]
    assert len({e.key for e in entries}) == 3 and all(e.processed_at is None for e in entries)


def test_steer_without_a_work_directory_says_what_to_run(tmp_path: Path) -> None:
    result = cli.invoke(app, ["steer", "hello", "--workdir", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "autoresearch demo" in said(result)
    assert not (tmp_path / "nothing").exists()


def test_a_bad_argument_creates_nothing_and_promises_nothing(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    result = cli.invoke(app, ["demo", "--workdir", str(work), "--profile", "tpu"])
    assert result.exit_code == 2 and "unknown profile 'tpu'" in said(result)
    assert "Nothing was lost" not in said(result) and not work.exists()


def test_a_work_directory_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    work.write_text("not a directory")
    result = cli.invoke(app, ["demo", "--workdir", str(work), "--profile", "smoke"])
    assert result.exit_code == 2 and "is a file, not a work directory" in said(result)
    assert "Errno" not in said(result)


def test_another_profile_in_a_work_directory_is_refused_before_preparing(tmp_path: Path) -> None:
    from bot.store import Store

    store = Store(tmp_path / "state.db")
    store.state.identity = {"profile": "smoke", "harness_hash": "h", "data_fingerprint": "d"}
    store.close()
    result = cli.invoke(app, ["demo", "--workdir", str(tmp_path), "--profile", "cpu"])
    assert result.exit_code == 1
    assert "measures with profile 'smoke', not 'cpu'" in said(result) and "another --workdir" in said(result)


def test_a_second_conductor_on_the_same_workdir_is_refused(tmp_path: Path) -> None:
    from bot.app.demo import lock_workdir

    held = lock_workdir(tmp_path)
    try:
        result = cli.invoke(app, ["demo", "--workdir", str(tmp_path), "--profile", "smoke"])
    finally:
        held.close()
    assert result.exit_code == 1
    assert "another autoresearch conductor is running" in said(result)


@pytest.mark.slow
def test_ctrl_c_says_it_stopped_and_that_the_same_command_resumes(tmp_path: Path, smoke_prepared) -> None:
    """Slow tier: a real demo must be running a real training run when it is interrupted."""
    import signal
    import subprocess
    import sys
    import time

    work = tmp_path / "demo"
    seeded_workdir(work, first_baseline_runs=2, baseline_runs=2)
    # a shell that starts a job in the background makes it ignore SIGINT, and Python then keeps
    # ignoring it; restore the default so the test does not depend on how pytest was started
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bot.app.cli",
            "demo",
            "--workdir",
            str(work),
            "--profile",
            "smoke",
            "--experiments",
            "1",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    while not list((work / "runs").glob("*/pid")):  # a training run has started
        assert time.time() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "stopped. Nothing was lost: run the same command again to resume" in " ".join(out.split())
    run_dir = next((work / "runs").glob("*/pid")).parent
    pid = int((run_dir / "pid").read_text())
    cmdline = Path(f"/proc/{pid}/cmdline")
    assert not cmdline.exists() or b"runner.execute" not in cmdline.read_bytes()
    # the interrupted run is lost, to be run again on resume: never counted as a crash of train.py
    from bot.runners.local import LocalRunner

    assert LocalRunner(work / "runs").lookup(int(run_dir.name)).state == "lost"


def test_plot_writes_the_chart_of_a_work_directory(tmp_path: Path) -> None:
    from bot.store import Store

    Store(tmp_path / "state.db").close()  # an empty work directory: a chart that says so
    done = cli.invoke(app, ["plot", "--workdir", str(tmp_path), "--out", str(tmp_path / "chart.svg")])
    assert done.exit_code == 0, said(done)
    assert (tmp_path / "chart.svg").read_text().startswith("<?xml") and "0 points" in said(done)
    bad = cli.invoke(app, ["plot", "--workdir", str(tmp_path), "--out", str(tmp_path / "chart.gif")])
    assert bad.exit_code == 2 and ".png or .svg" in said(bad)
    missing = cli.invoke(app, ["plot", "--workdir", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "no state.db" in said(missing)


@pytest.mark.parametrize("sandboxing", ["on", "off"])
def test_train_on_a_profile_whose_tokenizer_is_not_prepared_says_which_prepare_to_run(
    tmp_path: Path, smoke_prepared, monkeypatch, sandboxing: str
) -> None:
    from runner.profiles import get_profile
    from runner.tokenizer import is_cached

    cpu = get_profile("cpu")
    assert cpu.data == get_profile("smoke").data  # the data is shared: only the tokenizer is missing
    if is_cached(smoke_prepared.dataset, cpu.vocab_size):
        pytest.skip("the cpu profile's tokenizer was prepared in this session's cache")
    if sandboxing == "off":
        monkeypatch.setenv("AUTORESEARCH_SANDBOX", "off")
    untrained = tmp_path / "untrained.py"
    untrained.write_text(UNTRAINED)
    run = cli.invoke(app, ["train", "--profile", "cpu", "--asset", str(untrained), "--out", str(tmp_path / "run")])
    assert run.exit_code == 1
    assert "autoresearch prepare --profile cpu" in said(run) and "bwrap" not in said(run)


def test_results_and_status_through_a_pipe_are_written_whole(tmp_path: Path) -> None:
    """Without a terminal (CI, nohup, `| less`) nothing is cut at 80 columns: no `purpo…`, `val_b…`."""
    from bot.store import Store
    from tests.bot.views.test_results import experiment

    store = Store(tmp_path / "state.db")
    title = "a rather long title for an experiment that changes the learning rate schedule of the model"
    experiment(store, title, code_hash="c1", runs=[("ok", 2.91, {})], status="discard", val_bpb=2.91, delta=0.01)
    store.close()
    # one Python that runs the three commands with its stdout a pipe, as `autoresearch ... | less` does
    driver = (
        "import sys\nfrom bot.app.cli import app\n"
        "for command in (['results'], ['results', '--runs'], ['status']):\n"
        "    print('=== ' + ' '.join(command), flush=True)\n"
        "    try:\n"
        f"        app([*command, '--workdir', {str(tmp_path)!r}])\n"
        "    except SystemExit as end:\n"
        "        assert not end.code, (command, end.code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    outputs = dict(part.split("\n", 1) for part in proc.stdout.split("=== ")[1:])
    assert set(outputs) == {"results", "results --runs", "status"}
    for command, output in outputs.items():
        assert "…" not in output, (command, output)
    assert title in outputs["results"]
