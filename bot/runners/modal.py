"""The Modal runner: each job is one call of the deployed `runner.modal_app` Trainer, on its own GPU.

The runner is written against `ModalCalls`, five calls wide (spawn, poll, cancel, progress, and
the deployment's identity); `ModalClient` is those calls over the `modal` SDK, imported only
here, so the bot imports without it. What the runner knows about a job lives in
`<state_dir>/modal/<run_id>.json` (the JobSpec, the call id, when it was spawned, why a call
failed), so a restarted bot finds its calls and their results:

- submit writes the record first (the run id is the idempotency key: a second submit spawns
  nothing), then spawns the call and writes its id;
- lookup polls the call: no answer yet is queued (no progress line yet) or running; an answer is
  checked against the job (run id, task, asset, profile, this bot's harness) before it counts, and a
  refused one is lost with the reason; a call that failed (a container that crashed or was
  preempted and not restarted by Modal, a Modal error, an expired call: none of them the run's
  fault) is spawned again once, then the job is lost with both reasons, and the conductor runs it
  again; a call past the app's timeout (the run's own limit and the time to hand back its result)
  is a crash of its train.py, as a local run past every limit is, and is not spawned again;
- cancel marks the record, then cancels the call; the job is lost afterwards, never a result.

A deployment measures one task (AUTORESEARCH_TASK when it was deployed: runner.modal_app); at the
bot's start `check_ready` refuses one that measures another task than the bot's program.md names,
another profile or other data, saying what to deploy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from bot.core.records import Job, RunResult, RunStatus
from bot.runners.capacity import Slots
from bot.runners.journal import RunRecords
from bot.runners.specs import checked_result, finished_status, job_spec
from runner.profiles import harness_hash
from runner.protocol import JobSpec, ResultRefused, ResultSpec
from runner.tasks import DEFAULT_TASK

log = logging.getLogger(__name__)

MAX_CALLS = 2  # a failed call is spawned again once
DEPLOY = "modal deploy -m runner.modal_app"


class ModalSettings(BaseSettings):
    """Where the bot finds its Modal deployment (AUTORESEARCH_MODAL_* variables or .env)."""

    model_config = SettingsConfigDict(
        env_prefix="AUTORESEARCH_MODAL_", env_file=".env", env_ignore_empty=True, extra="ignore"
    )

    app: str = Field("autoresearch", description="the deployed app's name (as when it was deployed)")
    class_name: str = Field("Trainer", description="the app's training class")
    gpus: int = Field(1, ge=1, description="runs at once, each on its own Modal GPU: the runner's slots")
    dict_name: str = Field("autoresearch-progress", description="the Modal Dict the runs write progress to")


class ModalNotConfigured(RuntimeError):
    """Modal cannot be used from here (the SDK is missing, there is no token, the app is not deployed)."""


class CallFailed(RuntimeError):
    """A call ended without an answer: its container crashed or was taken away, the harness failed,
    or Modal no longer knows the call. Not the run's fault: spawning the job again may help."""


class CallTimedOut(CallFailed):
    """The call ran past the app's timeout: the run's own time limit and the time to hand its result
    back (runner.modal_app). The run had all its time, as a local run that outlived every limit
    (bot.runners.local): a crash of its train.py, not spawned again."""


class ModalCalls(Protocol):
    def spawn(self, job_json: str) -> str:
        """Start Trainer.run(job_json); return the call's id."""

    def poll(self, call_id: str) -> str | None:
        """The ResultSpec JSON, or None while the call runs. Raises CallFailed for a failed call;
        anything else (Modal unreachable) is an error worth asking again about."""

    def cancel(self, call_id: str) -> None:
        """Stop the call and its container (asking twice is harmless)."""

    def progress(self, run_id: int) -> dict[str, Any] | None:
        """The run's latest progress line, if any; never raises."""

    def identity(self) -> dict[str, str]:
        """The deployment's measurement identity: profile, harness_hash, data_fingerprint."""


class ModalRunner:
    def __init__(
        self,
        state_dir: Path,
        calls: ModalCalls,
        *,
        slots: int = 1,
        harness: str | None = None,
        slots_file: Path | None = None,
    ) -> None:
        self._slots = Slots(slots_file, slots)
        self.records = RunRecords(state_dir / "modal")
        self.calls = calls
        self.harness = harness or harness_hash()  # what a result must have been measured by

    @property
    def slots(self) -> int:
        """Calls at once (bot.runners.capacity). More than the deployment's max_containers
        (AUTORESEARCH_MODAL_GPUS when it was deployed) wait in Modal's queue, ready to start there
        the moment a container is free: deploy again with more to run them at once."""
        return self._slots()

    def on_change(self, callback: Callable[[], None]) -> None:
        """Modal tells nobody when a call ends: the driver's timer asks."""

    def notify(self) -> None:
        """No one outside tells of Modal's calls either."""

    def close(self) -> None:
        """Nothing held here: the calls go on, and the next bot reads them from its records."""

    def identity(self) -> dict[str, str]:
        """The identity to pin: the deployment's, refused if it runs another harness than this bot
        has for the deployment's task."""
        return self._same_harness(self.calls.identity())

    def _same_harness(self, found: dict[str, str]) -> dict[str, str]:
        task = found.get("task", DEFAULT_TASK)
        ours = self.harness if task == DEFAULT_TASK else harness_hash(task)
        if found.get("harness_hash") != ours:
            raise ModalNotConfigured(
                f"the Modal app measures with harness {found.get('harness_hash')}, this bot "
                f"with {ours}: deploy this version of the runner ({DEPLOY})"
            )
        return found

    def check_ready(self, identity: dict[str, str]) -> None:
        """At the bot's start: the deployed app must measure what the bot is configured for
        (`identity`: its task, profile and data), or every result would be refused, one lost run after
        another. Asks the deployment once; that may start a container (seconds when its data is
        cached)."""
        found = self.calls.identity()
        deployed, wanted = found.get("task", DEFAULT_TASK), identity.get("task", DEFAULT_TASK)
        if deployed != wanted:
            raise ModalNotConfigured(
                f"the Modal app measures the {deployed} task, this bot's program.md names {wanted}: deploy one for "
                f"it (AUTORESEARCH_TASK={wanted} AUTORESEARCH_PROFILE={identity.get('profile')} {DEPLOY})"
            )
        self._same_harness(found)
        for key, what in (("profile", "AUTORESEARCH_PROFILE"), ("data_fingerprint", "AUTORESEARCH_DATA_FINGERPRINT")):
            if found.get(key) != identity.get(key):
                raise ModalNotConfigured(
                    f"the Modal app measures {key} {found.get(key)!r}, this bot is configured for {identity.get(key)!r}: "
                    f"set {what} to the deployment's, or deploy for this one "
                    f"(AUTORESEARCH_PROFILE={identity.get('profile')} {DEPLOY})"
                )

    # --- the protocol ----------------------------------------------------------------------------
    def submit(self, job: Job) -> str:
        record = self.records.read(job.run_id)
        if record is None:
            record = {"run_id": job.run_id, "job": job_spec(job).model_dump_json(), "calls": []}
            self.records.write(record)  # first: a second submit spawns nothing
            self._spawn(record)
        return self._where(record)

    def lookup(self, run_id: int) -> RunStatus:
        record = self.records.read(run_id)
        if record is None:
            return RunStatus("unknown", detail=f"no job {run_id} was submitted to Modal from {self.records.dir}")
        if record.get("cancelled"):
            return RunStatus("lost", detail="cancelled")
        if record.get("lost"):
            return RunStatus("lost", detail=record["lost"])
        if record.get("timed_out"):
            return _timed_out(record)
        if record.get("result") is not None:
            return self._finished(record)
        if not record["calls"]:  # the bot stopped between writing the record and spawning
            self._spawn(record)
            return RunStatus("queued")
        call = record["calls"][-1]
        try:
            answer = self.calls.poll(call["id"])
        except CallTimedOut as error:
            call["failed"] = record["timed_out"] = str(error)
            self.records.write(record)
            log.warning("run %s: %s; a crash of its train.py, as a local run past every limit", run_id, error)
            return _timed_out(record)
        except CallFailed as error:
            return self._failed(record, str(error))
        if answer is None:
            progress = self.calls.progress(run_id)
            return RunStatus("running" if progress else "queued", progress=progress)
        record["result"] = answer
        self.records.write(record)  # later lookups answer from the file
        return self._finished(record)

    def cancel(self, run_id: int) -> None:
        record = self.records.read(run_id)
        if record is None:
            return
        if not record.get("cancelled"):
            record["cancelled"] = True
            self.records.write(record)  # first: a result that lands now is not taken
        if record["calls"] and record.get("result") is None and not record.get("lost"):
            self.calls.cancel(record["calls"][-1]["id"])

    # --- internals -------------------------------------------------------------------------------
    def _spawn(self, record: dict[str, Any]) -> None:
        spawned_at = time.time()
        call_id = self.calls.spawn(record["job"])
        record["calls"].append({"id": call_id, "spawned_at": spawned_at})
        self.records.write(record)
        log.info("run %s: Modal call %s spawned", record["run_id"], call_id)

    def _failed(self, record: dict[str, Any], reason: str) -> RunStatus:
        call = record["calls"][-1]
        call["failed"] = reason
        run_id = record["run_id"]
        if len(record["calls"]) < MAX_CALLS:
            log.warning("run %s: Modal call %s failed, spawning it again: %s", run_id, call["id"], reason)
            self._spawn(record)  # writes the record, with the reason
            return RunStatus("queued")
        reasons = "; then ".join(f"{c['id']}: {c.get('failed', '')}" for c in record["calls"])
        record["lost"] = (
            f"the Modal call failed {len(record['calls'])} times ({reasons}); why is in the "
            "app's logs (`modal app logs APP`, or the calls on modal.com)"
        )
        self.records.write(record)
        log.error("run %s lost: %s", run_id, record["lost"])
        return RunStatus("lost", detail=record["lost"])

    def _finished(self, record: dict[str, Any]) -> RunStatus:
        job = JobSpec.model_validate_json(record["job"])
        try:
            spec = ResultSpec.model_validate_json(record["result"])
            result = checked_result(
                job, spec, harness=self.harness if job.task == DEFAULT_TASK else harness_hash(job.task)
            )
        except ValidationError as error:
            return RunStatus(
                "lost",
                detail=f"result refused: the Modal call's answer is not a result "
                f"({error.error_count()} problems, the first: {error.errors()[0]['msg']})",
            )
        except ResultRefused as error:
            return RunStatus("lost", detail=f"result refused: {error}")
        return finished_status(result)

    def _where(self, record: dict[str, Any]) -> str:
        ids = [c["id"] for c in record["calls"]]
        return f"modal:{ids[-1]}" if ids else f"modal:{self.records.path(record['run_id'])}"


def _timed_out(record: dict[str, Any]) -> RunStatus:
    crash = RunResult(
        run_id=record["run_id"],
        status="crash",
        error=f"timed out: {record['timed_out']}",
        metrics={"outcome": "timeout", "modal_call": record["calls"][-1]["id"]},
    )
    return RunStatus("finished", result=crash)


class ModalClient:
    """`ModalCalls` over the modal SDK, against the deployed app. Constructing it checks for a token
    (no network); the app is looked up on first use."""

    def __init__(self, settings: ModalSettings, *, sdk: Any = None) -> None:
        self.modal = sdk if sdk is not None else _modal_with_token()  # tests give a stand-in for the SDK
        self.settings = settings
        self._trainer: Any = None
        self._progress: Any = None

    def _instance(self) -> Any:
        if self._trainer is None:
            cls = self.modal.Cls.from_name(self.settings.app, self.settings.class_name)
            self._trainer = cls()
        return self._trainer

    def spawn(self, job_json: str) -> str:
        try:
            call = self._instance().run.spawn(job_json, time.time())
        except self.modal.exception.NotFoundError as error:
            raise ModalNotConfigured(
                f"Modal has no app {self.settings.app!r} with class {self.settings.class_name!r} "
                f"({error}): deploy it with `{DEPLOY}`"
            ) from None
        return str(call.object_id)

    def poll(self, call_id: str) -> str | None:
        errors = self.modal.exception
        call = self.modal.FunctionCall.from_id(call_id)
        try:
            answer = call.get(timeout=0)
        except TimeoutError:  # the builtin one: no output yet (modal's timeouts are not subclasses of it)
            return None
        except (
            errors.ConnectionError,
            errors.AuthError,
            errors.ServiceError,
            errors.InternalError,
            errors.ResourceExhaustedError,
            OSError,
        ):
            raise  # Modal is unreachable or refuses us: ask again later, the call may be fine
        except errors.OutputExpiredError:
            raise CallFailed(f"Modal call {call_id} expired before its result was read") from None
        except errors.FunctionTimeoutError as error:
            raise CallTimedOut(f"Modal call {call_id} ran past the app's timeout ({error})") from None
        except errors.InternalFailure as error:
            raise CallFailed(f"Modal call {call_id}: its container failed ({error})") from None
        except errors.NotFoundError as error:
            raise CallFailed(f"Modal does not know call {call_id} ({error})") from None
        except errors.InputCancellation:  # a BaseException: someone cancelled the call on Modal
            raise CallFailed(f"Modal call {call_id} was cancelled outside the bot") from None
        except Exception as error:  # noqa: BLE001 - whatever the remote harness raised
            raise CallFailed(f"Modal call {call_id} failed: {type(error).__name__}: {error}") from None
        if not isinstance(answer, str):
            raise CallFailed(
                f"Modal call {call_id} answered a {type(answer).__name__}, not a result's JSON: "
                f"is the deployed app this version? ({DEPLOY})"
            )
        return answer

    def cancel(self, call_id: str) -> None:
        self.modal.FunctionCall.from_id(call_id).cancel(terminate_containers=True)

    def progress(self, run_id: int) -> dict[str, Any] | None:
        try:
            if self._progress is None:
                self._progress = self.modal.Dict.from_name(self.settings.dict_name, create_if_missing=True)
            line = self._progress.get(str(run_id))
        except Exception as error:  # noqa: BLE001 - progress is for display only
            log.debug("run %s: no progress from Modal (%s: %s)", run_id, type(error).__name__, error)
            return None
        return line if isinstance(line, dict) else None

    def identity(self) -> dict[str, str]:
        """Blocks: on a cold app this starts a container, which prepares the data first (minutes; the
        first time for the h100 profile, a download and a tokenizer)."""
        try:
            found = self._instance().identity.remote()
        except self.modal.exception.NotFoundError as error:
            raise ModalNotConfigured(
                f"Modal has no app {self.settings.app!r} with class {self.settings.class_name!r} "
                f"({error}): deploy it with `{DEPLOY}`"
            ) from None
        return {str(k): str(v) for k, v in dict(found).items()}


def _modal_with_token() -> Any:
    try:
        import modal
    except ImportError:
        raise ModalNotConfigured("the modal package is not installed: pip install 'autoresearch-bot[modal]'") from None
    if not (modal.config.config.get("token_id") and modal.config.config.get("token_secret")):
        raise ModalNotConfigured(
            "Modal has no token here: run `modal token new` (it writes ~/.modal.toml), or set MODAL_TOKEN_ID and "
            f"MODAL_TOKEN_SECRET; then deploy the training app once with `{DEPLOY}`"
        )
    return modal


def modal_runner(
    state_dir: Path, settings: ModalSettings | None = None, *, slots_file: Path | None = None
) -> ModalRunner:
    """The runner for a bot configured for Modal: raises ModalNotConfigured, saying what to do,
    when the SDK or a token is missing."""
    settings = settings or ModalSettings()
    return ModalRunner(state_dir, ModalClient(settings), slots=settings.gpus, slots_file=slots_file)
