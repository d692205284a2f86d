"""The GitHub Actions runner against the stand-in, which runs the project's own workflow file
(.github/workflows/autoresearch-train.yml) with a real `python -m runner.isolated`: dispatch,
artifact download and the result check, cancellation, lost and long-queued runs dispatched
again, and a restarted runner finding its runs."""

from __future__ import annotations

import io
import json
import logging
import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import github
import pytest
from github_standin import GitHubStandIn

from bot.core.records import Job, RunStatus, asset_sha256
from bot.runners.actions import ActionsRunner, ActionsSettings

ROOT = Path(__file__).resolve().parents[3]
WORKFLOW = (ROOT / ".github" / "workflows" / "autoresearch-train.yml").read_text()
CRASH = "raise SystemExit(3)\n"
SLEEP = "import time\ntime.sleep(3600)\n"  # ends when cancelled (or killed at the smoke profile's 120 s limit)
# Bounds on waits for a condition, never durations slept: each wait ends as soon as its answer is
# there. A workflow run is a real `python -m runner.isolated`, whose own wall-clock limits (the
# smoke profile: 120 s of training, 120 s of scoring, plus start-up) come first on a starved
# machine; this is above them and under pytest's timeout (600 s).
DEADLINE_S = 480.0
HTTP_TIMEOUT_S = 120  # s, an int (PyGithub's type): its 15 s default can run out on a starved machine


class Clock:
    """The runner's wall clock, moved by the test (the queued limit), never slept on."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def no_actions_settings_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """ActionsSettings reads AUTORESEARCH_ACTIONS_* variables: the tests set their own only."""
    for name in [n for n in os.environ if n.upper().startswith("AUTORESEARCH_ACTIONS_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def standin(tmp_path: Path, smoke_prepared: Any) -> Iterator[GitHubStandIn]:
    files = {".github/workflows/autoresearch-train.yml": WORKFLOW, "train.py": CRASH, "program.md": "# Program\n"}
    with GitHubStandIn(tmp_path / "github", files=files) as gh:
        yield gh
        assert gh.violations == []


@pytest.fixture
def repo(standin: GitHubStandIn) -> Any:
    gh = github.Github(
        auth=github.Auth.Token("tok-bot"),
        base_url=standin.api_url,
        retry=None,
        timeout=HTTP_TIMEOUT_S,
        seconds_between_requests=None,
        seconds_between_writes=None,
    )
    return gh.get_repo("octo-org/research")


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_runner(repo: Any, state: Path, clock: Clock, **settings: Any) -> ActionsRunner:
    return ActionsRunner(lambda: repo, state, ActionsSettings(**{"poll_interval_s": 0, **settings}), clock=clock)


@pytest.fixture
def runner(repo: Any, tmp_path: Path, clock: Clock) -> ActionsRunner:
    return make_runner(repo, tmp_path / "state", clock)


def job_at(standin: GitHubStandIn, run_id: int = 1, asset: str = CRASH, ref: str = "main") -> Job:
    commit = standin.ref(ref)
    assert commit is not None
    return Job(run_id=run_id, asset=asset, profile="smoke", seed=0, commit=commit, experiment_id=7)


def settle(runner: ActionsRunner, run_id: int, states: tuple[str, ...] = ("finished", "lost")) -> RunStatus:
    """Ask until the run is in one of `states` (polling a condition, with a generous bound)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        status = runner.lookup(run_id)
        if status.state in states:
            return status
        assert time.monotonic() < deadline, f"run {run_id} is still {status.state} after {DEADLINE_S:.0f} s: {status}"
        time.sleep(0.2)


def workflow_logs(standin: GitHubStandIn) -> str:
    """Every workflow run's state and log, for an assertion's message."""
    return "\n".join(
        f"--- workflow run {run.id}: {run.status} {run.conclusion}\n{run.log[-6000:]}"
        for run in list(standin.actions.runs.values())
    )


def record(tmp_path: Path, run_id: int) -> dict[str, Any]:
    return json.loads((tmp_path / "state" / "actions" / f"{run_id}.json").read_text())


def dispatches(standin: GitHubStandIn) -> int:
    return len(standin.calls("POST", r"/actions/workflows/autoresearch-train\.yml/dispatches$"))


def test_a_run_that_crashes_on_the_runner_comes_back_as_its_checked_crash_result(
    runner: ActionsRunner, standin: GitHubStandIn, tmp_path: Path
) -> None:
    """The project's workflow and its real supervisor, on a runner machine whose data is not
    prepared: the supervisor's crash result, written before any process of the run imports torch,
    comes back the way a train.py's crash does (artifact, download, check). A train.py's own crash
    on Actions is the slow tier's (test_a_result_for_another_train_py_is_refused_not_finished); on
    the isolated path `make test` has it in tests/bot/runners/test_local.py."""
    standin.actions.machine_env["AUTORESEARCH_CACHE"] = str(tmp_path / "unprepared")
    url = runner.submit(job_at(standin))
    assert runner.submit(job_at(standin)) == url and dispatches(standin) == 1  # idempotent by run id
    status = settle(runner, 1)
    assert status.state == "finished" and status.result is not None, f"{status}\n{workflow_logs(standin)}"
    result = status.result
    assert (result.run_id, result.status, result.metrics["outcome"]) == (1, "crash", "crash")
    assert "no prepared data" in (result.error or "") and "autoresearch prepare --profile smoke" in result.error, (
        result.error
    )
    assert "status:           crash" in result.log_tail  # the supervisor's summary block, from the artifact's log
    assert result.metrics["actions_url"] == url
    workflow_run_id = record(tmp_path, 1)["workflow_run_id"]
    assert result.metrics["runner"]["backend"] == "actions"
    assert result.metrics["runner"]["detail"] == f"{standin.api_url}/octo-org/research/actions/runs/{workflow_run_id}"
    assert result.metrics["timings"]["queued"] is not None
    assert result.metrics["asset_sha256"] == asset_sha256(CRASH)
    assert runner.lookup(1).state == "finished"  # from the record now: GitHub is not asked again
    assert dispatches(standin) == 1


@pytest.mark.slow
def test_a_result_for_another_train_py_is_refused_not_finished(
    runner: ActionsRunner, standin: GitHubStandIn, tmp_path: Path
) -> None:
    """Slow tier: it waits for the project's own workflow to run to its end, a real isolated run of a
    crashing train.py (`make test` runs the workflow to a supervisor's crash before training, above)."""
    runner.submit(job_at(standin))
    workflow_run = standin.actions.wait(record(tmp_path, 1)["workflow_run_id"], timeout=DEADLINE_S)
    artifact = standin.actions.artifacts[workflow_run.artifacts[0]]
    with zipfile.ZipFile(io.BytesIO(artifact.data)) as archive:
        result = json.loads(archive.read("result.json"))
    assert result["status"] == "crash", result  # train.py's crash, before the test alters its result
    assert "SystemExit" in result["log_tail"] or "code 3" in (result["error"] or ""), result["error"]
    result["hashes"]["asset"] = asset_sha256("print('another train.py')\n")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("result.json", json.dumps(result))
    artifact.data = buffer.getvalue()
    status = settle(runner, 1)
    assert status.state == "lost" and status.detail.startswith("result refused: "), status
    assert "another train.py" in status.detail and status.result is None


def test_a_commit_whose_train_py_is_not_the_job_s_never_trains(runner: ActionsRunner, standin: GitHubStandIn) -> None:
    runner.submit(job_at(standin, asset="print('not what main holds')\n"))
    status = settle(runner, 1)
    assert status.state == "lost" and "without a result" in status.detail, f"{status}\n{workflow_logs(standin)}"
    assert dispatches(standin) == 2  # a lost run is dispatched again exactly once
    logs = "".join(run.log for run in standin.actions.runs.values())
    assert "the commit does not hold the train.py the bot asked for" in logs


def test_a_lost_run_is_dispatched_again_exactly_once_then_lost(runner: ActionsRunner, standin: GitHubStandIn) -> None:
    standin.actions.lose(2)
    runner.submit(job_at(standin))
    status = settle(runner, 1)
    assert status.state == "lost" and "already been dispatched again once" in status.detail, status
    assert dispatches(standin) == 2
    assert runner.lookup(1).state == "lost" and dispatches(standin) == 2


@pytest.mark.slow
def test_a_deleted_run_is_dispatched_again_and_finishes(
    runner: ActionsRunner, standin: GitHubStandIn, tmp_path: Path
) -> None:
    """Slow tier: it waits for the project's own workflow to run to its end, a real isolated run (`make
    test` runs the workflow to a supervisor's crash before training, above)."""
    standin.actions.hold()
    runner.submit(job_at(standin))
    first = record(tmp_path, 1)["workflow_run_id"]
    standin.actions.delete(first)
    assert runner.lookup(1).state == "queued"
    assert record(tmp_path, 1)["workflow_run_id"] != first
    standin.actions.release()
    status = settle(runner, 1)
    assert status.state == "finished" and dispatches(standin) == 2, f"{status}\n{workflow_logs(standin)}"


@pytest.mark.slow
def test_a_run_queued_past_the_limit_is_cancelled_and_dispatched_again(
    repo: Any, standin: GitHubStandIn, tmp_path: Path, clock: Clock
) -> None:
    """Slow tier: it waits for the project's own workflow to run to its end, a real isolated run (`make
    test` runs the workflow to a supervisor's crash before training, above)."""
    runner = make_runner(repo, tmp_path / "state", clock, queued_limit_s=600)
    standin.actions.hold()
    runner.submit(job_at(standin))
    first = record(tmp_path, 1)["workflow_run_id"]
    clock.now += 300
    assert runner.lookup(1).state == "queued" and dispatches(standin) == 1
    clock.now += 301
    assert runner.lookup(1).state == "queued"
    assert standin.actions.runs[first].conclusion == "cancelled"
    assert record(tmp_path, 1)["attempts"] == 2 and dispatches(standin) == 2
    standin.actions.release()
    status = settle(runner, 1)
    assert status.state == "finished", f"{status}\n{workflow_logs(standin)}"


def test_a_run_no_runner_starts_is_lost_after_the_last_attempt(
    repo: Any, standin: GitHubStandIn, tmp_path: Path, clock: Clock
) -> None:
    runner = make_runner(repo, tmp_path / "state", clock, queued_limit_s=10, max_attempts=2)
    standin.actions.hold()
    runner.submit(job_at(standin))
    for _ in range(2):
        clock.now += 11
        status = runner.lookup(1)
    assert status.state == "lost" and "AUTORESEARCH_RUNS_ON" in status.detail
    assert all(run.conclusion == "cancelled" for run in standin.actions.runs.values())


def test_dispatches_and_cancels_are_paced_as_what_they_are(
    repo: Any, standin: GitHubStandIn, tmp_path: Path, clock: Clock
) -> None:
    """The write ledger records each by its kind (bot.store.schema's writes.what)."""
    paced: list[str] = []
    settings = ActionsSettings(poll_interval_s=0, queued_limit_s=10, max_attempts=2)
    runner = ActionsRunner(lambda: repo, tmp_path / "state", settings, clock=clock, pace_write=paced.append)
    standin.actions.hold()
    runner.submit(job_at(standin))
    clock.now += 11
    assert runner.lookup(1).state == "queued"  # cancelled and dispatched again
    assert paced == ["dispatch", "cancel", "dispatch"]


def test_a_cancelled_run_ends_cancelled_and_reports_nothing_more(
    runner: ActionsRunner, standin: GitHubStandIn, tmp_path: Path
) -> None:
    standin.push_file("train.py", SLEEP, user="octo-org", message="a slow train.py")
    runner.submit(job_at(standin, asset=SLEEP))
    workflow_run_id = record(tmp_path, 1)["workflow_run_id"]
    standin.actions.wait(workflow_run_id, "in_progress", timeout=DEADLINE_S)
    runner.cancel(1)
    assert standin.actions.wait(workflow_run_id, timeout=DEADLINE_S).conclusion == "cancelled"
    status = runner.lookup(1)
    assert status.state == "lost" and status.result is None and "cancelled" in status.detail
    runner.cancel(1)  # twice is fine
    assert make_runner(runner._repo(), tmp_path / "state", Clock()).lookup(1).state == "lost"


def test_a_run_in_progress_past_the_limit_is_cancelled_and_dispatched_again(
    repo: Any, standin: GitHubStandIn, tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # Its runner went away without a word (GitHub has not failed the job yet): one run lost, not a crash.
    runner = make_runner(repo, tmp_path / "state", clock, running_limit_s=900)
    standin.push_file("train.py", SLEEP, user="octo-org", message="a slow train.py")
    runner.submit(job_at(standin, asset=SLEEP))
    first = record(tmp_path, 1)["workflow_run_id"]
    standin.actions.wait(first, "in_progress", timeout=DEADLINE_S)
    assert runner.lookup(1).state == "running"
    clock.now += 901
    with caplog.at_level(logging.WARNING):
        status = runner.lookup(1)
    assert status.state == "queued" and record(tmp_path, 1)["workflow_run_id"] != first
    assert standin.actions.wait(first, timeout=DEADLINE_S).conclusion == "cancelled"
    assert "its runner went away without a word" in caplog.text
    runner.cancel(1)


@pytest.mark.slow
def test_a_restarted_runner_finds_its_run(
    repo: Any, runner: ActionsRunner, standin: GitHubStandIn, tmp_path: Path, clock: Clock
) -> None:
    """Slow tier: it waits for the project's own workflow to run to its end, a real isolated run (`make
    test` runs the workflow to a supervisor's crash before training, above)."""
    url = runner.submit(job_at(standin))
    again = make_runner(repo, tmp_path / "state", clock)
    assert again.submit(job_at(standin)) == url
    status = settle(again, 1)
    assert status.state == "finished", f"{status}\n{workflow_logs(standin)}"
    assert dispatches(standin) == 1, workflow_logs(standin)
    assert again.lookup(99).state == "unknown"


def test_lookups_ask_github_once_per_interval_unless_notified(
    repo: Any, standin: GitHubStandIn, tmp_path: Path, clock: Clock
) -> None:
    runner = make_runner(repo, tmp_path / "state", clock, poll_interval_s=30)
    told: list[int] = []
    runner.on_change(lambda: told.append(1))
    standin.actions.hold()
    runner.submit(job_at(standin))

    def asked() -> int:
        return len(standin.calls("GET", r"/actions/runs/\d+$"))

    assert runner.lookup(1).state == "queued" and asked() == 1
    assert runner.lookup(1).state == "queued" and asked() == 1
    runner.notify()
    assert told == [1]
    assert runner.lookup(1).state == "queued" and asked() == 2


def test_settings_read_the_environment_and_count_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_ACTIONS_RUNNERS", "3")
    monkeypatch.setenv("AUTORESEARCH_ACTIONS_QUEUE_AHEAD", "2")
    settings = ActionsSettings()
    assert (settings.slots, settings.workflow, settings.ref, settings.queued_limit_s) == (
        9,
        "autoresearch-train.yml",
        "main",
        600.0,
    )


@pytest.mark.slow
def test_the_repository_s_train_py_trains_and_scores_on_actions(
    repo: Any, standin: GitHubStandIn, tmp_path: Path, clock: Clock
) -> None:
    """Slow tier: the real train.py trains its whole budget in the project's own workflow."""
    asset = (ROOT / "train.py").read_text()
    standin.push_file("train.py", asset, user="octo-org", message="the real train.py")
    runner = make_runner(repo, tmp_path / "state", clock)
    runner.submit(job_at(standin, asset=asset))
    status = settle(runner, 1)
    assert status.state == "finished" and status.result is not None, f"{status}\n{workflow_logs(standin)}"
    assert status.result.status == "ok", f"{status.result.error}\n{status.result.log_tail}"
    assert status.result.val_bpb is not None and status.result.val_bpb > 0
