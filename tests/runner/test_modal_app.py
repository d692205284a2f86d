"""The Modal app (runner.modal_app): it builds without a token or a network, its image installs what
pyproject pins, and its Trainer's body (via Modal's `.local()`, on this machine) hands a job to a
worker prepared before it came and answers a ResultSpec, never a builtin TimeoutError. In `make
test` that worker is a fake; in the slow tier it is the isolated path's."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

modal = pytest.importorskip("modal")


def _runner_package_on_its_path() -> None:
    """Under pytest `runner` is the namespace package of tests/runner/ (conftest puts tests/ first on
    sys.path; its modules come from the install's finder), but Modal's class decorator wants the
    directory of the module it decorates on its package's __path__, as it is outside tests."""
    import runner

    home = str(Path(importlib.util.find_spec("runner.modal_app").origin).parent)  # type: ignore[arg-type, union-attr]
    if home not in list(runner.__path__):
        runner.__path__.append(home)


_runner_package_on_its_path()
from runner import modal_app  # noqa: E402 (once the path above is set)
from runner.profiles import get_profile, harness_hash  # noqa: E402
from runner.protocol import Hashes, JobSpec, ResultSpec, RunnerIdentity, check_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CRASH = 'raise SystemExit("boom: this train.py crashes on purpose")\n'

BUILD = """
import json, socket
def refuse(*args, **kwargs):
    raise OSError("no network in this test")
socket.socket.connect = refuse
socket.create_connection = refuse
import modal
import runner.modal_app as m
print(json.dumps({"app": m.app.name, "deployed": m.DEPLOYED, "timeout": m.TIMEOUT_S, "gpu": m.GPU,
                  "is_cls": isinstance(m.Trainer, modal.Cls), "image": isinstance(m.image, modal.Image),
                  "volume": isinstance(m.cache_volume, modal.Volume)}))
"""


def test_the_app_builds_without_a_token_or_a_network(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODAL_", "AUTORESEARCH_"))}
    env.update(
        HOME=str(tmp_path),
        MODAL_CONFIG_PATH=str(tmp_path / "no-modal.toml"),
        PYTHONPATH=str(ROOT),
        AUTORESEARCH_MODAL_APP="research-test",
        AUTORESEARCH_MODAL_GPU="A10G",
        AUTORESEARCH_PROFILE="smoke",
        AUTORESEARCH_MODAL_SCALEDOWN_S="60",
    )
    done = subprocess.run(
        [sys.executable, "-c", BUILD], check=False, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    built = json.loads(done.stdout.strip().splitlines()[-1])
    assert built["app"] == "research-test" and built["is_cls"] and built["image"] and built["volume"]
    assert built["deployed"]["AUTORESEARCH_MODAL_GPU"] == "A10G"
    assert built["gpu"] is None  # the smoke profile runs on the CPU: its containers ask for no GPU
    assert built["deployed"]["AUTORESEARCH_MODAL_SCALEDOWN_S"] == "60"
    assert built["deployed"]["AUTORESEARCH_MODAL_VOLUME"] == "autoresearch-cache"
    assert built["timeout"] == int(get_profile("smoke").max_total_s) + 120


def test_the_image_installs_the_training_dependencies_pyproject_pins() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["optional-dependencies"]["train"])
    wanted |= {d for d in project["dependencies"] if d.startswith(("numpy", "pydantic>"))}
    assert wanted == set(modal_app.TRAIN_PACKAGES)


CRASH_JOB = JobSpec(run_id=7, experiment_id=3, asset=CRASH, profile="smoke", seed=1)

# For `make test`: runner.isolated.Supervisor as NextRun uses it, without its two processes that
# import torch. What the Trainer does around the run is under test here (its worker prepared before
# the job, the next one prepared at once, the answer); the isolated run itself is the slow tier's
# (test_each_job_gets_a_worker_prepared_before_it_came, test_the_repository_train_py_measures_through_local).
FAKE_WORKER = """
import runner.isolated
from runner.profiles import harness_hash
from runner.protocol import Hashes, ResultSpec, RunnerIdentity

class FakeWorker:
    made = []

    def __init__(self, out, profile, *, backend):
        self.out, self.profile, self.backend, self.prepared, self.ran = out, profile, backend, False, None
        FakeWorker.made.append(self)

    def prepare(self):
        self.prepared = True

    def run(self, job, *, received_at, detail, on_progress):
        assert self.prepared, "the job came to a worker that was not prepared"
        self.ran = job.run_id
        return ResultSpec(
            run_id=job.run_id, experiment_id=job.experiment_id, status="crash", error="the fake's crash of " + job.asset,
            hashes=Hashes(asset=job.asset_sha256, harness=harness_hash(), data=""),
            runner=RunnerIdentity(backend=self.backend), profile=job.profile, seed=job.seed,
        )

runner.isolated.Supervisor = FakeWorker
"""


@pytest.fixture(scope="module")
def deployed(smoke_prepared: Any) -> Local:
    """One container's life through Modal's `.local()`, with FAKE_WORKER for its workers: what
    Trainer().identity answers, what Trainer().run answers for CRASH_JOB, and its workers."""
    return _run_locally(CRASH_JOB, spawned_at=100.0, fake_worker=True)


def test_a_job_comes_back_as_its_result_through_local(deployed: Local) -> None:
    result = ResultSpec.model_validate_json(deployed.answer)
    check_result(CRASH_JOB, result, harness=harness_hash())
    assert result.status == "crash" and "crashes on purpose" in (result.error or "")
    assert result.runner.backend == "modal"
    assert result.timings.queued is not None and result.timings.queued > 0  # spawned at t=100 s (1970)
    # the container's first worker, prepared at its start, ran the job; the next one was prepared then
    assert deployed.workers == [["smoke", "modal", True, CRASH_JOB.run_id], ["smoke", "modal", True, None]]


@pytest.mark.slow
def test_the_repository_train_py_measures_through_local(smoke_prepared: Any) -> None:
    """Slow tier: the real train.py trains its whole budget, through a real isolated run (`make test`
    sends a job the same way, to a fake worker)."""
    job = JobSpec(run_id=8, asset=(ROOT / "train.py").read_text(), profile="smoke")
    result = ResultSpec.model_validate_json(_run_locally(job).answer)
    check_result(job, result, harness=harness_hash())
    assert result.status == "ok", result.error
    assert result.val_bpb is not None and result.val_bpb > 0 and result.timings.queued is None
    assert result.hashes.data == smoke_prepared.dataset.fingerprint


def test_the_deployment_tells_its_measurement_identity(deployed: Local, smoke_prepared: Any) -> None:
    assert deployed.identity == {
        "profile": "smoke",
        "harness_hash": harness_hash(),
        "data_fingerprint": smoke_prepared.dataset.fingerprint,
    }


LOCAL = """
import json, sys, warnings
import runner.modal_app as m
warnings.simplefilter("ignore")  # Modal: "executing locally ... no access to the mounted Volume"
spawned_at = float(sys.argv[1]) if sys.argv[1] != "-" else None
trainer = m.Trainer()
print(json.dumps(trainer.identity.local()))
print(trainer.run.local(sys.stdin.read(), spawned_at))
made = [[w.profile, w.backend, w.prepared, w.ran] for w in getattr(runner.isolated.Supervisor, "made", [])]
print(json.dumps(made))
"""


@dataclasses.dataclass
class Local:
    identity: dict[str, str]  # what Trainer().identity answered
    answer: str  # what Trainer().run answered: the run's ResultSpec as JSON
    workers: list[list[Any]]  # with FAKE_WORKER, each worker made: [profile, backend, prepared, run id it ran]


def _run_locally(
    job: JobSpec, spawned_at: float | None = None, *, fake_worker: bool = False, env: dict[str, str] | None = None
) -> Local:
    """`Trainer().identity.local()` and `.run.local(job)` on one Trainer in a fresh Python, whose
    `runner` is the package itself (under pytest it is tests/runner/'s namespace package), with the
    session's data cache (or what `env` sets); its workers are FAKE_WORKER's with `fake_worker`."""
    env = dict(os.environ, AUTORESEARCH_PROFILE="smoke", PYTHONPATH=str(ROOT), **(env or {}))
    script = "import runner.isolated\n" + (FAKE_WORKER if fake_worker else "") + LOCAL
    done = subprocess.run(
        [sys.executable, "-c", script, str(spawned_at) if spawned_at else "-"],
        check=False,
        input=job.model_dump_json(),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    identity, answer, workers = done.stdout.strip().splitlines()[-3:]
    return Local(json.loads(identity), answer, json.loads(workers))


def test_a_job_for_another_profile_is_refused_with_what_to_deploy() -> None:
    job = JobSpec(run_id=1, asset=CRASH, profile="smoke")
    with pytest.raises(RuntimeError, match="AUTORESEARCH_PROFILE=smoke"):
        modal_app.run_one(job.model_dump_json(), "h100", run_job=_never)


def test_a_job_of_another_task_is_refused_with_what_to_deploy() -> None:
    job = JobSpec(task="ticket-routing", run_id=1, asset="def route(texts): ...\n", profile="smoke")
    with pytest.raises(
        RuntimeError, match="this Modal app measures training: deploy it with AUTORESEARCH_TASK=ticket-routing"
    ):
        modal_app.run_one(job.model_dump_json(), "smoke", run_job=_never)


def test_a_task_deployment_prepares_pins_and_measures_its_task_through_local(tmp_path: Path) -> None:
    """A container deployed with AUTORESEARCH_TASK=ticket-routing prepares the task's tickets (no
    torch, no training data), tells the task's identity and runs the starter router cold."""
    starter = (ROOT / "runner" / "tasks" / "ticket_routing" / "router.py").read_text()
    job = JobSpec(task="ticket-routing", run_id=5, asset=starter, profile="smoke", seed=1)
    cache = tmp_path / "cache"
    deployed = _run_locally(job, env={"AUTORESEARCH_TASK": "ticket-routing", "AUTORESEARCH_CACHE": str(cache)})
    assert deployed.identity["task"] == "ticket-routing" and deployed.identity["profile"] == "smoke"
    assert deployed.identity["harness_hash"] == harness_hash("ticket-routing")
    result = ResultSpec.model_validate_json(deployed.answer)
    check_result(job, result, harness=harness_hash("ticket-routing"))
    assert result.status == "ok" and result.value is not None and result.runner.backend == "modal"
    assert result.hashes.data == deployed.identity["data_fingerprint"] and deployed.workers == []
    assert not (cache / "data").exists()  # training's data was never prepared


def test_a_task_deployed_on_a_profile_it_has_not_fails_the_deploy(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTORESEARCH_TASK="query-latency", AUTORESEARCH_PROFILE="h100")
    done = subprocess.run(
        [sys.executable, "-c", "import runner.modal_app"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode != 0 and "the query-latency task has no h100 profile" in done.stderr


def test_a_harness_timeout_never_reads_as_a_call_still_running() -> None:
    def times_out(*args: Any, **kwargs: Any) -> ResultSpec:
        raise TimeoutError("a socket timed out")

    job = JobSpec(run_id=1, asset=CRASH, profile="smoke")
    with pytest.raises(RuntimeError, match="TimeoutError: a socket timed out") as raised:
        modal_app.run_one(job.model_dump_json(), "smoke", run_job=times_out)
    assert not isinstance(raised.value, TimeoutError)


def test_a_failing_progress_store_never_fails_the_run() -> None:
    store = BrokenStore()
    job = JobSpec(run_id=4, asset=CRASH, profile="smoke")

    def reports(job: JobSpec, out: Path, **options: Any) -> ResultSpec:
        for step in range(3):
            options["on_progress"]({"step": step, "loss": 5.0})
        assert options["backend"] == "modal" and options["detail"] == "fc-123" and out.is_dir()
        return _result(job)

    answer = modal_app.run_one(job.model_dump_json(), "smoke", progress_store=store, call_id="fc-123", run_job=reports)
    assert ResultSpec.model_validate_json(answer).run_id == 4
    assert store.tries == 1  # the first error switched the board off


def test_progress_is_written_by_run_id_at_most_every_few_seconds() -> None:
    now = [1000.0]
    store = Store()
    board = modal_app.ProgressBoard(store, 12, clock=lambda: now[0])
    board.push({"step": 1})
    board.push({"step": 2})  # same instant: dropped
    now[0] += modal_app.PROGRESS_EVERY_S
    board.push({"step": 3})
    assert store.items == [("12", {"step": 1}), ("12", {"step": 3})]


class Store:
    def __init__(self) -> None:
        self.items: list[tuple[Any, Any]] = []

    def put(self, key: Any, value: Any) -> None:
        self.items.append((key, value))


class BrokenStore:
    def __init__(self) -> None:
        self.tries = 0

    def put(self, key: Any, value: Any) -> None:
        self.tries += 1
        raise ConnectionError("Modal is unreachable")


def _never(*args: Any, **kwargs: Any) -> ResultSpec:
    raise AssertionError("the job should not have run")


def _result(job: JobSpec) -> ResultSpec:
    return ResultSpec(
        run_id=job.run_id,
        status="crash",
        error="canned",
        hashes=Hashes(asset=job.asset_sha256, harness=harness_hash(), data=""),
        runner=RunnerIdentity(backend="modal"),
        profile=job.profile,
    )


@pytest.mark.slow
def test_each_job_gets_a_worker_prepared_before_it_came(smoke_prepared: Any) -> None:
    """Slow tier: two workers (each two processes that import torch) for one crash, to see a job take
    a ready worker and the next one prepared while it runs (`.local()` in `make test` takes the
    container's worker the same way, ready or not)."""
    # What Trainer does: one worker prepared at the container's start, the next one while a job runs.
    workers = modal_app.NextRun("smoke")
    try:
        workers.refill()
        assert workers._next.wait_ready(300), "the prepared worker never got ready"
        job = JobSpec(run_id=5, asset=CRASH, profile="smoke")
        result = ResultSpec.model_validate_json(
            modal_app.run_one(job.model_dump_json(), "smoke", workers=workers, call_id="fc-123")
        )
        check_result(job, result, harness=harness_hash())
        assert result.status == "crash" and "crashes on purpose" in (result.error or "")
        assert result.metrics["warm"] is True and result.runner.detail == "fc-123"
        assert workers._next is not None, "the next job's worker is prepared while this one runs"
    finally:
        workers.close()
