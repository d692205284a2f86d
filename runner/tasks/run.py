"""The isolated run of a task other than training: a JobSpec to its task's evaluator, a ResultSpec back.

runner.isolated.run_job (and so `python -m runner.isolated --job`, the path every runner takes)
sends a job whose task is not training here. `run_task_job` finds the task (runner.tasks), checks
its prepared inputs (the evaluator's `fingerprint(profile)`: missing ones are a crash that says
to run `autoresearch prepare --task T`, as training's missing data is), and hands the asset to the
evaluator's `evaluate` with a private directory OUT/work. The evaluator sandboxes the asset's code
and gates it before it measures (runner.tasks); this module only turns its Evaluation into a
ResultSpec: the asset's sha256, the harness hash (runner.profiles.harness_hash, which covers
runner/tasks/), the inputs' fingerprint, the timings, whether it ran sandboxed, status and error.
An evaluator that raises is most likely a fault of this machine or of the harness, but may be the
asset's doing: the run is `lost`, so it runs again rather than ending its experiment, and says so.
Lost that way a second time in a row, it is charged as the asset's crash (bot.loop.runs,
MAX_KILLED_RUNS): an asset that makes its evaluator raise gets one re-run, never more.

The run directory gets log.txt (what the asset printed, then the summary block with the metric's
name) and result.json, as a training run's does.

`prepare_task` and `task_identity` are a task's runner.prepare.prepare and
runner.identity.measurement_identity: its fixed inputs made once, and the identity a loop pins
(profile, the task's harness hash, the inputs' fingerprint, and the task, which training's has not).
Both refuse a profile the task has none of (runner.profiles.check_task_profile), naming those it
has; a run under one is a crash that says the same.

`data` names a data source of the user's instead of the profile's own, as training's does: an
evaluator that takes one declares DATA_SOURCES (what it may name) and a `data` keyword on its
three functions; naming one for a task whose evaluator takes none is refused. The inputs'
fingerprint is then the named data's, so the identity and each result tell the two apart.
"""

from __future__ import annotations

import importlib
import re
import shutil
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from runner import files, run_log, sandbox
from runner.data import DataMissing
from runner.profiles import check_task_profile, harness_hash
from runner.protocol import Hashes, JobSpec, ResultSpec, RunnerIdentity, Timings
from runner.tasks import TASKS, Evaluation, get_task


def run_task_job(
    job: JobSpec,
    out: Path,
    *,
    backend: str = "local",
    detail: str = "",
    data: str | None = None,
    on_line: Callable[[str], None] | None = None,
) -> ResultSpec:
    """Evaluate `job`'s asset with its task's evaluator in run directory `out`, on the profile's
    inputs or `data`'s; never raises for a bad asset, a missing input, a profile or data source the
    task has not, or a failing evaluator (each is a result that says why)."""
    received = time.time()
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").unlink(missing_ok=True)
    workdir = out / "work"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir()
    evaluation, fingerprint = _evaluate(job, workdir, data)
    result = ResultSpec(
        task=job.task,
        run_id=job.run_id,
        experiment_id=job.experiment_id,
        status=evaluation.status,
        value=evaluation.value if evaluation.status == "ok" else None,
        error=evaluation.error,
        metrics={
            **evaluation.metrics,
            "total_seconds": round(time.time() - received, 3),
            "eval_seconds": round(evaluation.evaluation_s, 3),
        },
        timings=Timings(
            sandbox_setup=evaluation.setup_s, evaluation=evaluation.evaluation_s, total=time.time() - received
        ),
        hashes=Hashes(
            asset=job.asset_sha256, harness=harness_hash(job.task) if job.task in TASKS else "", data=fingerprint
        ),
        runner=RunnerIdentity(
            backend=backend,
            host=socket.gethostname(),
            device="cpu",
            sandbox=sandbox.available()[1] if evaluation.sandboxed else "none",
            detail=detail,
        ),
        sandboxed=evaluation.sandboxed,
        profile=job.profile,
        seed=job.seed,
    )
    output = _marked_claims(evaluation.log_tail, job.task)
    if on_line is not None:
        for line in output.splitlines():
            on_line(line)
    files.write_text(out / "log.txt", (output + "\n" if output else "") + "\n" + result.summary_block() + "\n")
    result = result.model_copy(update={"log_tail": run_log.tail(out / "log.txt")})
    files.write_text(out / "result.json", result.model_dump_json(indent=2))
    return result


def evaluator_of(task: str) -> ModuleType:
    """The module that prepares and evaluates `task` (runner.tasks); ValueError for an unknown task."""
    return importlib.import_module(get_task(task).evaluator)


def prepare_task(task: str, profile: str, *, data: str | None = None, progress: bool = False) -> str:
    """Make the task's fixed inputs for `profile` (from `data`, when named; a second call does no
    work); their fingerprint. ValueError for a profile or data source the task has not."""
    check_task_profile(task, profile)
    return evaluator_of(task).prepare(profile, progress=progress, **_data_option(task, data))


def task_identity(task: str, profile: str, *, data: str | None = None) -> dict[str, str]:
    """The measurement identity of a loop of `task` under `profile` (on `data`, when named).
    Raises DataMissing when the inputs are not prepared, ValueError as prepare_task does."""
    check_task_profile(task, profile)
    return {
        "profile": profile,
        "harness_hash": harness_hash(task),
        "data_fingerprint": evaluator_of(task).fingerprint(profile, **_data_option(task, data)),
        "task": task,
    }


def _data_option(task: str, data: str | None) -> dict[str, str]:
    """The keyword that hands `data` to the task's evaluator (none when no source is named);
    ValueError when the evaluator takes no data source of the user's."""
    if data is None:
        return {}
    if not hasattr(evaluator_of(task), "DATA_SOURCES"):
        raise ValueError(f"the {task} task takes no data source (--data): it makes its own inputs from the profile")
    return {"data": data}


def _evaluate(job: JobSpec, workdir: Path, data: str | None) -> tuple[Evaluation, str]:
    """The evaluator's Evaluation of the job's asset, and the prepared inputs' fingerprint ("" when
    the run never got to them)."""
    try:
        task = get_task(job.task)
    except ValueError as error:  # a job from a newer bot, say
        return Evaluation(
            "crash", error=f"{error}: this runner does not know the task; update it to the bot's version"
        ), ""
    try:
        check_task_profile(task.name, job.profile)
        option = _data_option(task.name, data)
    except ValueError as error:  # the job or this runner's setting asks for what the task has not
        return Evaluation("crash", error=str(error)), ""
    fingerprint = ""
    try:
        evaluator = evaluator_of(task.name)
        fingerprint = evaluator.fingerprint(job.profile, **option)
        return evaluator.evaluate(job.asset, job.profile, job.seed, workdir, **option), fingerprint
    except DataMissing as error:
        return Evaluation("crash", error=str(error)), fingerprint
    except Exception as error:  # the evaluator's own failure: the run is lost and runs again
        return Evaluation(
            "lost",
            error=(
                f"the {task.name} evaluator failed ({type(error).__name__}: {error}), most likely a fault of "
                "this machine or of the harness: the run is lost and runs again (a second time in a row, it is "
                "charged as the asset's crash)"
            ),
            log_tail=traceback.format_exc(),
        ), fingerprint


def _marked_claims(output: str, task: str) -> str:
    """What the asset printed, with a line that looks like the summary's score marked as its claim:
    only the summary block names the metric at the start of a line."""
    try:
        name = get_task(task).metric.name
    except ValueError:
        return output
    return re.sub(rf"^(?={re.escape(name)}:)", "(the asset printed) ", output, flags=re.MULTILINE)
