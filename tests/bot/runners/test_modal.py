"""The Modal runner (bot.runners.modal) against a double of the deployed app: one call per run id,
results checked before they count, a failed call spawned again once and then lost, cancel, and a
restarted bot that finds its calls in the state directory. Plus the SDK facts ModalClient relies
on, and a missing token's message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from bot.core.records import Job
from bot.runners.modal import CallFailed, CallTimedOut, ModalClient, ModalNotConfigured, ModalRunner, ModalSettings
from runner.profiles import harness_hash
from runner.protocol import Hashes, JobSpec, ResultSpec, RunnerIdentity, Timings

ROOT = Path(__file__).resolve().parents[3]
CRASH = 'raise SystemExit("boom: this train.py crashes on purpose")\n'


class FakeCall:
    def __init__(self, job_json: str) -> None:
        self.job = JobSpec.model_validate_json(job_json)
        self.answer: str | None = None
        self.failure: str | None = None
        self.timed_out: str | None = None  # ran past the app's timeout (FunctionTimeoutError)
        self.cancelled = False


class FakeModal:
    """The deployed app as the runner sees it (ModalCalls): each spawn is a call with an id, open
    until the test answers it with a ResultSpec or fails it; progress lines by run id."""

    def __init__(self, harness: str | None = None, task: str = "training") -> None:
        self.calls: dict[str, FakeCall] = {}
        self.lines: dict[int, dict[str, Any]] = {}
        self.harness = harness or harness_hash(task)
        self.task = task  # what it was deployed for (AUTORESEARCH_TASK)
        self.unreachable = False

    def spawn(self, job_json: str) -> str:
        if self.unreachable:
            raise ConnectionError("Modal is unreachable")
        call_id = f"fc-{len(self.calls) + 1}"
        self.calls[call_id] = FakeCall(job_json)
        return call_id

    def poll(self, call_id: str) -> str | None:
        if self.unreachable:
            raise ConnectionError("Modal is unreachable")
        call = self.calls.get(call_id)
        if call is None:
            raise CallFailed(f"Modal does not know call {call_id}")
        if call.timed_out:
            raise CallTimedOut(call.timed_out)
        if call.failure:
            raise CallFailed(call.failure)
        return call.answer

    def cancel(self, call_id: str) -> None:
        if self.unreachable:
            raise ConnectionError("Modal is unreachable")
        self.calls[call_id].cancelled = True

    def progress(self, run_id: int) -> dict[str, Any] | None:
        return self.lines.get(run_id)

    def identity(self) -> dict[str, str]:
        found = {"profile": "smoke", "harness_hash": self.harness, "data_fingerprint": "d" * 16}
        return found if self.task == "training" else dict(found, task=self.task)

    # --- what the test does as Modal -----------------------------------------------------------
    def last(self) -> FakeCall:
        return list(self.calls.values())[-1]

    def answer(self, call: FakeCall | None = None, **changes: Any) -> None:
        call = call or self.last()
        call.answer = canned(call.job, **changes).model_dump_json()


def canned(job: JobSpec, **changes: Any) -> ResultSpec:
    fields: dict[str, Any] = {
        "run_id": job.run_id,
        "experiment_id": job.experiment_id,
        "status": "ok",
        "val_bpb": 1.25,
        "metrics": {"num_steps": 40},
        "timings": Timings(queued=12.5, total=60.0),
        "profile": job.profile,
        "seed": job.seed,
        "hashes": Hashes(asset=job.asset_sha256, harness=harness_hash(), data="d" * 16),
        "runner": RunnerIdentity(backend="modal", device="NVIDIA H100", detail="fc-1"),
        "sandboxed": True,
    }
    return ResultSpec(**(fields | changes))


def job(run_id: int = 1, asset: str = "print('train')\n") -> Job:
    return Job(run_id=run_id, asset=asset, profile="smoke", seed=3, commit="abc123", experiment_id=9)


@pytest.fixture
def modal() -> FakeModal:
    return FakeModal()


@pytest.fixture
def runner(tmp_path: Path, modal: FakeModal) -> ModalRunner:
    return ModalRunner(tmp_path, modal, slots=2)


def test_submit_spawns_one_call_per_run_id(runner: ModalRunner, modal: FakeModal, tmp_path: Path) -> None:
    where = runner.submit(job(1))
    assert runner.submit(job(1)) == where == "modal:fc-1"
    assert list(modal.calls) == ["fc-1"] and modal.last().job.asset == job(1).asset
    record = json.loads((tmp_path / "modal" / "1.json").read_text())
    assert record["calls"][0]["id"] == "fc-1" and record["calls"][0]["spawned_at"] > 0


def test_a_call_is_queued_until_it_reports_progress(runner: ModalRunner, modal: FakeModal) -> None:
    runner.submit(job(1))
    assert runner.lookup(1).state == "queued"
    modal.lines[1] = {"step": 12, "loss": 4.2, "remaining_seconds": 200}
    status = runner.lookup(1)
    assert status.state == "running" and status.progress == {"step": 12, "loss": 4.2, "remaining_seconds": 200}


def test_an_answer_becomes_the_checked_result(runner: ModalRunner, modal: FakeModal) -> None:
    runner.submit(job(1))
    modal.answer()
    status = runner.lookup(1)
    assert status.state == "finished" and status.result is not None
    assert status.result.status == "ok" and status.result.val_bpb == 1.25 and status.result.run_id == 1
    assert status.result.metrics["runner"]["backend"] == "modal"
    assert status.result.metrics["timings"]["queued"] == 12.5
    assert status.result.metrics["harness_hash"] == harness_hash()


def test_a_crash_answer_is_a_crash_result(runner: ModalRunner, modal: FakeModal) -> None:
    runner.submit(job(1))
    modal.answer(status="timeout", val_bpb=None, error="ran past the hard limit")
    status = runner.lookup(1)
    assert status.state == "finished" and status.result is not None
    assert status.result.status == "crash" and status.result.error == "timed out: ran past the hard limit"


def test_a_restarted_bot_finds_its_calls_and_their_results(tmp_path: Path, modal: FakeModal) -> None:
    ModalRunner(tmp_path, modal).submit(job(1))
    again = ModalRunner(tmp_path, modal)
    assert again.lookup(1).state == "queued"
    assert again.submit(job(1)) == "modal:fc-1" and len(modal.calls) == 1
    modal.answer()
    assert again.lookup(1).state == "finished"
    forgotten = FakeModal()  # Modal no longer knows the call: the answer was kept with the run
    status = ModalRunner(tmp_path, forgotten).lookup(1)
    assert status.state == "finished" and status.result is not None and status.result.val_bpb == 1.25


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"hashes": Hashes(asset="0" * 64, harness=harness_hash(), data="")}, "another train.py"),
        (
            {
                "hashes": Hashes(
                    asset=JobSpec(run_id=1, asset="print('train')\n", profile="smoke").asset_sha256,
                    harness="0123456789abcdef",
                    data="",
                )
            },
            "harness 0123456789abcdef",
        ),
        ({"run_id": 2}, "the result is for run 2"),
        ({"profile": "cpu"}, "ran profile cpu"),
    ],
)
def test_a_result_that_does_not_answer_its_job_is_refused_as_lost(
    runner: ModalRunner, modal: FakeModal, changes: dict[str, Any], reason: str
) -> None:
    runner.submit(job(1))
    modal.answer(**changes)
    status = runner.lookup(1)
    assert status.state == "lost" and status.detail.startswith("result refused: ") and reason in status.detail
    assert runner.lookup(1).detail == status.detail and len(modal.calls) == 1  # refused, not run again here


def test_an_answer_that_is_not_a_result_is_refused_as_lost(runner: ModalRunner, modal: FakeModal) -> None:
    runner.submit(job(1))
    modal.last().answer = json.dumps({"val_bpb": 0.1})
    status = runner.lookup(1)
    assert status.state == "lost" and status.detail.startswith("result refused: ")


def test_a_failed_call_is_spawned_again_once_then_lost(runner: ModalRunner, modal: FakeModal) -> None:
    runner.submit(job(1))
    modal.last().failure = "its container failed (OOM)"
    assert runner.lookup(1).state == "queued"
    assert list(modal.calls) == ["fc-1", "fc-2"] and modal.last().job == modal.calls["fc-1"].job
    modal.last().failure = "Modal does not know call fc-2"
    status = runner.lookup(1)
    assert status.state == "lost"
    assert "failed 2 times" in status.detail and "fc-1: its container failed (OOM)" in status.detail
    assert "fc-2: Modal does not know call fc-2" in status.detail
    assert runner.lookup(1).state == "lost" and len(modal.calls) == 2


def test_a_call_past_the_app_s_timeout_is_a_crash_of_the_run_not_spawned_again(
    tmp_path: Path, runner: ModalRunner, modal: FakeModal
) -> None:
    # The app's timeout is the run's own limit and the time to hand back its result: the run had all
    # its time, as a local run that outlived every limit, which is a crash of its train.py.
    runner.submit(job(1))
    modal.last().timed_out = "Modal call fc-1 ran past the app's timeout (FunctionTimeoutError)"
    status = runner.lookup(1)
    assert status.state == "finished" and status.result is not None and status.result.status == "crash"
    assert status.result.error.startswith("timed out: Modal call fc-1 ran past")
    assert status.result.metrics["outcome"] == "timeout" and len(modal.calls) == 1
    again = ModalRunner(tmp_path, FakeModal()).lookup(1)  # a restarted bot reads it from the record
    assert again.state == "finished" and again.result is not None and again.result.status == "crash"


def test_the_client_reads_a_call_past_the_app_s_timeout_as_timed_out() -> None:
    errors = pytest.importorskip("modal").exception
    with pytest.raises(CallTimedOut, match="timeout"):
        ModalClient(ModalSettings(), sdk=StandInSDK(errors.FunctionTimeoutError("boom"))).poll("fc-1")


def test_a_call_spawned_again_can_still_finish(runner: ModalRunner, modal: FakeModal) -> None:
    runner.submit(job(1))
    modal.last().failure = "the call expired"
    runner.lookup(1)
    modal.answer()
    assert runner.lookup(1).state == "finished"
    assert runner.submit(job(1)) == "modal:fc-2"


def test_cancel_stops_the_call_and_never_takes_its_answer(runner: ModalRunner, modal: FakeModal) -> None:
    runner.submit(job(1))
    runner.cancel(1)
    assert modal.last().cancelled
    modal.answer()  # it answered anyway, just before the cancel reached it
    status = runner.lookup(1)
    assert status.state == "lost" and status.detail == "cancelled"
    runner.cancel(1)
    runner.cancel(99)  # never submitted: nothing to do


def test_a_cancel_that_did_not_reach_modal_is_sent_again(runner: ModalRunner, modal: FakeModal) -> None:
    runner.submit(job(1))
    modal.unreachable = True
    with pytest.raises(ConnectionError):
        runner.cancel(1)
    modal.unreachable = False
    assert runner.lookup(1).detail == "cancelled" and not modal.last().cancelled
    runner.cancel(1)
    assert modal.last().cancelled


def test_a_run_never_submitted_is_unknown(runner: ModalRunner) -> None:
    assert runner.lookup(5).state == "unknown"


def test_modal_unreachable_is_an_error_to_ask_again_not_a_lost_run(runner: ModalRunner, modal: FakeModal) -> None:
    runner.submit(job(1))
    modal.unreachable = True
    with pytest.raises(ConnectionError):
        runner.lookup(1)
    modal.unreachable = False
    assert runner.lookup(1).state == "queued" and len(modal.calls) == 1


def test_a_bot_stopped_before_its_spawn_spawns_at_the_next_lookup(runner: ModalRunner, modal: FakeModal) -> None:
    modal.unreachable = True
    with pytest.raises(ConnectionError):
        runner.submit(job(1))
    modal.unreachable = False
    assert runner.submit(job(1)) == "modal:" + str(
        runner.records.dir / "1.json"
    )  # the record is there: no second spawn
    assert runner.lookup(1).state == "queued" and list(modal.calls) == ["fc-1"]


def test_the_deployed_app_must_measure_with_this_bots_harness(tmp_path: Path) -> None:
    assert ModalRunner(tmp_path, FakeModal()).identity()["profile"] == "smoke"
    with pytest.raises(ModalNotConfigured, match="modal deploy -m runner.modal_app"):
        ModalRunner(tmp_path, FakeModal(harness="0123456789abcdef")).identity()


def test_a_deployment_for_another_profile_or_data_stops_the_bot_at_its_start(tmp_path: Path) -> None:
    runner = ModalRunner(tmp_path, FakeModal())
    ours = {"profile": "smoke", "harness_hash": harness_hash(), "data_fingerprint": "d" * 16}
    runner.check_ready(ours)
    with pytest.raises(ModalNotConfigured, match="AUTORESEARCH_PROFILE=h100 modal deploy"):
        runner.check_ready(dict(ours, profile="h100"))
    with pytest.raises(ModalNotConfigured, match="AUTORESEARCH_DATA_FINGERPRINT"):
        runner.check_ready(dict(ours, data_fingerprint="e" * 16))


def test_a_deployment_for_another_task_stops_the_bot_at_its_start(tmp_path: Path) -> None:
    training = {"profile": "smoke", "harness_hash": harness_hash(), "data_fingerprint": "d" * 16}
    routing = dict(training, harness_hash=harness_hash("ticket-routing"), task="ticket-routing")
    with pytest.raises(
        ModalNotConfigured, match="measures the training task, this bot's program.md names ticket-routing"
    ):
        ModalRunner(tmp_path, FakeModal()).check_ready(routing)
    deployed = ModalRunner(tmp_path, FakeModal(task="ticket-routing"))
    with pytest.raises(ModalNotConfigured, match="AUTORESEARCH_TASK=training AUTORESEARCH_PROFILE=smoke modal deploy"):
        deployed.check_ready(training)
    deployed.check_ready(routing)
    assert deployed.identity() == routing  # pinned with the task's harness, which this bot has too


def test_a_task_jobs_answer_is_checked_against_that_tasks_harness(tmp_path: Path) -> None:
    modal = FakeModal(task="ticket-routing")
    runner = ModalRunner(tmp_path, modal)
    runner.submit(Job(run_id=1, asset="def route(texts): ...\n", profile="smoke", seed=0, task="ticket-routing"))
    call = modal.last()
    hashes = Hashes(asset=call.job.asset_sha256, harness=harness_hash("ticket-routing"), data="d" * 16)
    modal.answer(call, task="ticket-routing", val_bpb=None, value=0.8, hashes=hashes)
    status = runner.lookup(1)
    assert status.state == "finished" and status.result is not None and status.result.status == "ok"
    modal.answer(call, task="ticket-routing", val_bpb=None, value=0.8)  # measured by training's harness
    runner.records.write({**runner.records.read(1), "result": None})
    assert runner.lookup(1).state == "lost"


def test_settings_come_from_autoresearch_modal_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no .env here
    monkeypatch.setenv("AUTORESEARCH_MODAL_APP", "research")
    monkeypatch.setenv("AUTORESEARCH_MODAL_GPUS", "3")
    settings = ModalSettings()
    assert (settings.app, settings.class_name, settings.gpus, settings.dict_name) == (
        "research",
        "Trainer",
        3,
        "autoresearch-progress",
    )


# --- a call that runs the Trainer's body on a thread -------------------------------------------------
CALL = """
import sys
from runner.modal_app import run_one
try:
    print(run_one(sys.stdin.read(), "smoke", spawned_at=0.0, call_id=sys.argv[1]))
except RuntimeError as error:
    print("FAILED", error)
"""


class ThreadedModal(FakeModal):
    """Each spawn runs what Trainer.run runs (runner.modal_app.run_one: the isolated path) on a thread,
    in a fresh Python as a container would (and whose `runner` is the package, not tests/runner/)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[threading.Thread] = []

    def spawn(self, job_json: str) -> str:
        call_id = super().spawn(job_json)
        call = self.calls[call_id]

        def run() -> None:
            done = subprocess.run(
                [sys.executable, "-c", CALL, call_id],
                check=False,
                input=job_json,
                capture_output=True,
                text=True,
                env=dict(os.environ, PYTHONPATH=str(ROOT)),
                cwd=ROOT,
                timeout=300,
            )
            answer = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            if done.returncode != 0 or answer.startswith("FAILED"):
                call.failure = answer or done.stderr[-2000:]
            else:
                call.answer = answer

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()
        return call_id


@pytest.mark.slow
def test_a_job_runs_through_the_isolated_path_on_a_modal_call(tmp_path: Path, smoke_prepared: Any) -> None:
    """Slow tier: a real isolated run behind the call, to read a real answer (the same run through
    Modal's own `.local()` is tests/runner/test_modal_app.py's, in `make test`)."""
    pytest.importorskip("modal")
    modal = ThreadedModal()
    runner = ModalRunner(tmp_path, modal)
    runner.submit(job(1, asset=CRASH))
    modal.threads[0].join()
    status = runner.lookup(1)
    assert status.state == "finished" and status.result is not None, status.detail or modal.last().failure
    assert status.result.status == "crash" and "crashes on purpose" in (status.result.error or "")
    assert status.result.metrics["runner"]["backend"] == "modal" and status.result.metrics["runner"]["detail"] == "fc-1"
    assert status.result.metrics["timings"]["queued"] > 0
    assert len(modal.calls) == 1


# --- the SDK as ModalClient uses it --------------------------------------------------------------------
class StandInCall:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.cancelled_with: dict[str, Any] | None = None

    def get(self, timeout: float | None = None) -> Any:
        assert timeout == 0
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self, **options: Any) -> None:
        self.cancelled_with = options


class StandInSDK:
    """The part of the modal module ModalClient touches, with Modal's own exception classes."""

    def __init__(self, outcome: Any) -> None:
        import modal

        self.exception = modal.exception
        self.call = StandInCall(outcome)
        self.FunctionCall = self

    def from_id(self, call_id: str) -> StandInCall:
        return self.call


def test_modal_raises_no_builtin_timeout_for_an_expired_or_timed_out_call() -> None:
    """ModalClient reads a builtin TimeoutError from get(timeout=0) as "no output yet"; Modal's own
    timeouts must not be one (modal 1.x: modal.exception.TimeoutError derives from modal's Error)."""
    errors = pytest.importorskip("modal").exception
    for kind in (errors.OutputExpiredError, errors.FunctionTimeoutError, errors.TimeoutError):
        assert not issubclass(kind, TimeoutError)


@pytest.mark.parametrize(
    ("outcome", "read"),
    [
        (TimeoutError(), None),
        ('{"result": 1}', '{"result": 1}'),
    ],
)
def test_the_client_reads_a_running_or_finished_call(outcome: Any, read: str | None) -> None:
    pytest.importorskip("modal")
    assert ModalClient(ModalSettings(), sdk=StandInSDK(outcome)).poll("fc-1") == read


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("OutputExpiredError", "expired"),
        ("FunctionTimeoutError", "timeout"),
        ("InternalFailure", "container failed"),
        ("NotFoundError", "does not know"),
        ("InputCancellation", "cancelled outside the bot"),
        ("RuntimeError", "RuntimeError: the harness failed"),
    ],
)
def test_the_client_reads_a_failed_call_as_failed(name: str, message: str) -> None:
    errors = pytest.importorskip("modal").exception
    error = RuntimeError("the harness failed") if name == "RuntimeError" else getattr(errors, name)("boom")
    with pytest.raises(CallFailed, match=message):
        ModalClient(ModalSettings(), sdk=StandInSDK(error)).poll("fc-1")


def test_the_client_lets_an_unreachable_modal_through_to_ask_again() -> None:
    errors = pytest.importorskip("modal").exception
    with pytest.raises(errors.ConnectionError):
        ModalClient(ModalSettings(), sdk=StandInSDK(errors.ConnectionError("no route"))).poll("fc-1")


def test_the_client_cancels_the_call_with_its_container() -> None:
    pytest.importorskip("modal")
    sdk = StandInSDK(None)
    ModalClient(ModalSettings(), sdk=sdk).cancel("fc-1")
    assert sdk.call.cancelled_with == {"terminate_containers": True}


NO_TOKEN = """
from pathlib import Path
from bot.runners.modal import ModalNotConfigured, modal_runner
try:
    modal_runner(Path("state"))
except ModalNotConfigured as error:
    print(error)
"""


def test_a_missing_token_says_how_to_set_one(tmp_path: Path) -> None:
    pytest.importorskip("modal")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODAL_")}
    env.update(HOME=str(tmp_path), MODAL_CONFIG_PATH=str(tmp_path / "no-modal.toml"), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", NO_TOKEN],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "modal token new" in done.stdout and "MODAL_TOKEN_ID" in done.stdout and "modal deploy" in done.stdout
