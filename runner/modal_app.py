"""The Modal app: training runs on Modal GPUs, on demand (or another task's runs: AUTORESEARCH_TASK).

Deploy it once (and again after every change to the harness, whose hash results must match):

    modal deploy -m runner.modal_app

One class, `Trainer`, on one GPU per container. A container prepares the profile's data and
tokenizer once (`@modal.enter`, cached on the Volume mounted at /cache), then runs jobs one at a
time: `run(job_json)` runs the job through `runner.isolated` in a fresh temporary directory and
returns the ResultSpec as JSON, exactly as a local run would produce it. Each job gets a worker
prepared before it came (`NextRun`: its sandboxed training and scoring processes have imported
torch and loaded the data), and the next job's worker gets ready while this one runs. Containers
stay warm for `scaledown_window` seconds between runs, so a queue of runs pays the container's
start-up once. torch's compile caches do not carry from run to run: each training sandbox has its
own /tmp, so that no train.py can leave compiled code, or trained weights, for the next. Progress
lines go to a Modal Dict keyed by run id, for the bot's lookup(); a failure there never fails a run.

A deployment measures one task (runner.tasks), as a repository holds one: with AUTORESEARCH_TASK
naming another than training, a container prepares that task's fixed inputs for the profile
instead (`runner.tasks.run.prepare_task`, cached on the Volume), pins the task's identity
(`task_identity`: its harness, its inputs, the task) and runs each job cold through
runner.isolated, which hands it to the task's evaluator; a job of another task is refused, saying
what to deploy. A profile the task has none of fails the deploy (runner.profiles.check_task_profile).

Everything is read from the environment of whoever deploys, and handed to the containers:

    AUTORESEARCH_MODAL_APP          the app's name (default autoresearch)
    AUTORESEARCH_PROFILE            the profile it measures (default h100); its max_total_s sets the timeout
    AUTORESEARCH_TASK               the task it measures (default training; ticket-routing, query-latency)
    AUTORESEARCH_MODAL_GPU          the GPU type (default H100; a CPU profile's containers get none)
    AUTORESEARCH_MODAL_GPUS         containers at once, at most (default 1: the bot's slots)
    AUTORESEARCH_MODAL_VOLUME       the cache Volume (default autoresearch-cache)
    AUTORESEARCH_MODAL_DICT_NAME    the progress Dict (default autoresearch-progress)
    AUTORESEARCH_MODAL_SCALEDOWN_S  seconds a container waits idle for the next run (default 300)
    AUTORESEARCH_MODAL_STARTUP_S    seconds a container may take to start, data preparation included
                                    (default 3600: the h100 profile's first download and tokenizer)

Importing this module (and so building the app) needs neither a Modal token nor a network.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import modal

from runner.profiles import check_task_profile, get_profile
from runner.tasks import DEFAULT_TASK

log = logging.getLogger(__name__)

CACHE = "/cache"
# The training dependencies, as pinned in pyproject.toml (the `train` extra, and what the harness
# itself imports); a test checks they agree.
TRAIN_PACKAGES = (
    "torch==2.13.0",
    "tiktoken>=0.9",
    "rustbpe>=0.1.0",
    "pyarrow>=15",
    "numpy>=1.26",
    "pydantic>=2.6",
    "kernels>=0.17,<0.18",
)
PROGRESS_EVERY_S = 2.0  # at most one progress write a run per this many seconds


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


# Deploy-time settings; `DEPLOYED` hands the same values to the containers, which import this module too.
DEPLOYED = {
    "AUTORESEARCH_MODAL_APP": _env("AUTORESEARCH_MODAL_APP", "autoresearch"),
    "AUTORESEARCH_PROFILE": _env("AUTORESEARCH_PROFILE", "h100"),
    "AUTORESEARCH_TASK": _env("AUTORESEARCH_TASK", DEFAULT_TASK),
    "AUTORESEARCH_MODAL_GPU": _env("AUTORESEARCH_MODAL_GPU", "H100"),
    "AUTORESEARCH_MODAL_GPUS": _env("AUTORESEARCH_MODAL_GPUS", "1"),
    "AUTORESEARCH_MODAL_VOLUME": _env("AUTORESEARCH_MODAL_VOLUME", "autoresearch-cache"),
    "AUTORESEARCH_MODAL_DICT_NAME": _env("AUTORESEARCH_MODAL_DICT_NAME", "autoresearch-progress"),
    "AUTORESEARCH_MODAL_SCALEDOWN_S": _env("AUTORESEARCH_MODAL_SCALEDOWN_S", "300"),
    "AUTORESEARCH_MODAL_STARTUP_S": _env("AUTORESEARCH_MODAL_STARTUP_S", "3600"),
}
PROFILE = get_profile(DEPLOYED["AUTORESEARCH_PROFILE"])  # an unknown profile fails the deploy, with the choices
TASK = DEPLOYED["AUTORESEARCH_TASK"]
check_task_profile(TASK, PROFILE.name)  # so do an unknown task and a profile the task has not
TIMEOUT_S = int(PROFILE.max_total_s) + 120  # a run's own limit, and time to hand its result back
# A container gets the GPU only where the profile runs on one: a CPU profile (another task's, or
# training's cpu and smoke) is not billed for an idle H100.
GPU = DEPLOYED["AUTORESEARCH_MODAL_GPU"] if PROFILE.device == "cuda" else None


def _skip_bytecode(path: Path) -> bool:
    """The runner package goes up whole (its built-in corpus too), without compiled files."""
    return path.suffix == ".pyc" or "__pycache__" in path.parts


image = (
    modal.Image.debian_slim(python_version="3.11")
    .apt_install("bubblewrap")
    .pip_install(*TRAIN_PACKAGES)
    .env({"AUTORESEARCH_CACHE": CACHE})
    .add_local_python_source("runner", ignore=_skip_bytecode)
)
cache_volume = modal.Volume.from_name(DEPLOYED["AUTORESEARCH_MODAL_VOLUME"], create_if_missing=True)
app = modal.App(DEPLOYED["AUTORESEARCH_MODAL_APP"], image=image)


class ProgressStore(Protocol):
    def put(self, key: Any, value: Any) -> Any: ...


class ProgressBoard:
    """Writes a run's latest progress line to a shared store (a Modal Dict), at most every
    PROGRESS_EVERY_S seconds; the first error switches it off for the run, which goes on."""

    def __init__(
        self, store: ProgressStore | None, run_id: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.key = str(run_id)
        self.clock = clock
        self._last: float | None = None

    def push(self, line: dict[str, Any]) -> None:
        now = self.clock()
        if self.store is None or (self._last is not None and now - self._last < PROGRESS_EVERY_S):
            return
        self._last = now
        try:
            self.store.put(self.key, dict(line))
        except Exception as error:  # noqa: BLE001 - progress is for display; the run must not fail for it
            log.warning(
                "run %s: progress cannot be shown (%s: %s); the run goes on", self.key, type(error).__name__, error
            )
            self.store = None


def _progress_store() -> ProgressStore | None:
    """The progress Dict in a Modal container; nothing when run locally (`.local()`, tests)."""
    if modal.is_local():
        return None
    return modal.Dict.from_name(DEPLOYED["AUTORESEARCH_MODAL_DICT_NAME"], create_if_missing=True)


def _commit_cache() -> None:
    """Make what this container wrote to /cache (data, tokenizer) visible to the next."""
    if modal.is_local():
        return
    try:
        cache_volume.commit()
    except Exception as error:  # noqa: BLE001 - a cold cache only costs time
        log.warning(
            "the cache volume could not be committed (%s: %s); later containers start colder",
            type(error).__name__,
            error,
        )


@app.cls(
    gpu=GPU,
    volumes={CACHE: cache_volume},
    env=DEPLOYED,
    timeout=TIMEOUT_S,
    startup_timeout=int(DEPLOYED["AUTORESEARCH_MODAL_STARTUP_S"]),
    scaledown_window=int(DEPLOYED["AUTORESEARCH_MODAL_SCALEDOWN_S"]),
    max_containers=int(DEPLOYED["AUTORESEARCH_MODAL_GPUS"]),
)
class Trainer:
    @modal.enter()
    def load(self) -> None:
        """Once per container: torch imported, the profile's data and tokenizer ready on /cache; or
        another task's fixed inputs."""
        self.profile = os.environ.get("AUTORESEARCH_PROFILE") or PROFILE.name
        self.task = os.environ.get("AUTORESEARCH_TASK") or TASK
        self.workers: NextRun | None = None
        if self.task != DEFAULT_TASK:
            from runner.tasks.run import prepare_task

            log.info(
                "task %s, profile %s ready: inputs %s",
                self.task,
                self.profile,
                prepare_task(self.task, self.profile)[:12],
            )
            _commit_cache()
            return
        import torch  # noqa: F401 - the first run should not pay for the import

        from runner.prepare import prepare

        prepared = prepare(self.profile)
        log.info(
            "profile %s ready: data %s, tokenizer %s",
            self.profile,
            prepared.dataset.fingerprint[:12],
            "trained now" if prepared.trained_tokenizer else "cached",
        )
        _commit_cache()
        self.workers = NextRun(self.profile)
        self.workers.refill()  # even the container's first job starts warm, if it comes a few seconds later

    @modal.exit()
    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()

    @modal.method()
    def run(self, job_json: str, spawned_at: float | None = None) -> str:
        """One job: its ResultSpec as JSON. A job for another profile or task than the deployed one is an error."""
        return run_one(
            job_json,
            self.profile,
            task=self.task,
            spawned_at=spawned_at,
            progress_store=_progress_store(),
            call_id=modal.current_function_call_id() or "",
            workers=self.workers,
        )

    @modal.method()
    def identity(self) -> dict[str, str]:
        """The measurement identity this deployment measures under (profile, harness, data, and the
        task for another than training), for the bot to pin before it sends a job."""
        if self.task != DEFAULT_TASK:
            from runner.tasks.run import task_identity

            return task_identity(self.task, self.profile)
        from runner.identity import measurement_identity

        return measurement_identity(self.profile)


class NextRun:
    """A container's worker for its next job: a runner.isolated.Supervisor prepared in a temporary
    directory before the job comes. `take()` gives it (or a cold one), and the caller `refill()`s
    at once, so that the next worker imports torch while the current job trains. Each worker
    serves one job: nothing of a train.py outlives its run."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self._next: Any = None

    def take(self) -> Any:
        worker, self._next = self._next, None
        return worker if worker is not None else self._prepare()

    def refill(self) -> None:
        if self._next is None:
            self._next = self._prepare()

    def close(self) -> None:
        worker, self._next = self._next, None
        if worker is not None:
            worker.discard()
            shutil.rmtree(worker.out, ignore_errors=True)

    def _prepare(self) -> Any:
        from runner.isolated import Supervisor

        worker = Supervisor(Path(tempfile.mkdtemp(prefix="run-")), self.profile, backend="modal")
        worker.prepare()
        return worker


def run_one(
    job_json: str,
    profile: str,
    *,
    task: str = DEFAULT_TASK,
    spawned_at: float | None = None,
    progress_store: ProgressStore | None = None,
    call_id: str = "",
    run_job: Callable[..., Any] | None = None,
    workers: NextRun | None = None,
) -> str:
    """The body of `Trainer.run`: run the job of the deployed `task` in a fresh directory (a
    prepared worker's, from `workers`, or a cold run through `run_job`), return its ResultSpec JSON.

    Only RuntimeError ever leaves it: Modal reads a builtin TimeoutError from a call as "still
    running", so a harness failure must never look like one."""
    from runner.protocol import JobSpec

    started = time.time()
    try:
        job = JobSpec.model_validate_json(job_json)
        if job.profile != profile:
            raise ValueError(
                f"run {job.run_id} asks for profile {job.profile}, but this Modal app measures "
                f"{profile}: deploy it with AUTORESEARCH_PROFILE={job.profile} "
                "(modal deploy -m runner.modal_app), or run the bot with that profile"
            )
        if job.task != task:
            raise ValueError(
                f"run {job.run_id} is of the {job.task} task, but this Modal app measures {task}: deploy it "
                f"with AUTORESEARCH_TASK={job.task} (modal deploy -m runner.modal_app), as a repository holds one task"
            )
        board = ProgressBoard(progress_store, job.run_id)
        if workers is not None and run_job is None:
            worker = workers.take()
            workers.refill()
            try:
                result = worker.run(job, received_at=started, detail=call_id, on_progress=board.push)
            finally:
                shutil.rmtree(worker.out, ignore_errors=True)
        else:
            if run_job is None:
                from runner import isolated

                run_job = isolated.run_job
            with tempfile.TemporaryDirectory(prefix=f"run-{job.run_id}-") as tmp:
                result = run_job(job, Path(tmp), backend="modal", detail=call_id, on_progress=board.push)
    except Exception as error:  # see the docstring
        raise RuntimeError(f"the harness failed on Modal ({type(error).__name__}: {error})") from error
    if result.timings.queued is None and spawned_at is not None:
        timings = result.timings.model_copy(update={"queued": round(max(0.0, started - spawned_at), 3)})
        result = result.model_copy(update={"timings": timings})
    return result.model_dump_json()
