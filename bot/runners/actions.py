"""The GitHub Actions runner: each job is one `workflow_dispatch` of the training workflow
(.github/workflows/autoresearch-train.yml) on the repository's self-hosted GPU runners.

The workflow checks out the job's commit, refuses an asset (train.py, or another task's: the
`task` input, sent only for a task other than training) whose sha256 is not the job's, runs
`python -m runner.isolated --backend actions`, and uploads result.json and log.txt as the artifact
`autoresearch-run-<run_id>`. This runner dispatches it (`return_run_details`, so GitHub names the
workflow run at once), asks GitHub about that workflow run when the conductor looks, downloads
the artifact when it has completed, and checks the result against the job before reporting it:
a result for another run, train.py or harness is reported lost ("result refused: ..."), never
finished.

What it keeps, per run, in `<state_dir>/actions/<run_id>.json` (so a restarted bot finds its
runs): the job, the workflow run id and its URL, when it was dispatched and seen started, the
attempts, and once known the outcome. The idempotency key of `submit` is that file: a run id with
a file is never dispatched again by submit. Re-dispatches happen only here, each recorded:
- a workflow run left queued past `queued_limit_s` is cancelled and dispatched again (at most
  `max_attempts` dispatches in all; then the run is lost: no runner is picking it up);
- a workflow run that completed without a result artifact (whatever its conclusion: the harness
  uploads a result for every run it ran, a crash of train.py included, so none means the runner
  went away or a step before training failed), was deleted, or stayed in progress past
  `running_limit_s` (its runner gone without a word; it is cancelled) is dispatched again exactly
  once; the second time the run is lost, and the conductor queues it again (bot.loop.runs).
The slots are the runners times (1 + `queue_ahead`), the runners counted as
bot.runners.capacity says (`runners`, or the number an operator wrote to the slots file).
A dispatch whose answer was lost (a 5xx after GitHub acted) is not retried by the client; submit
then raises and the conductor submits again on a later tick, which may leave one orphaned
workflow run on GitHub (its artifact is never read).

GitHub is asked at most once per `poll_interval_s` per run, unless `notify()` (a `workflow_run`
or `workflow_job` webhook) says something changed.
"""

from __future__ import annotations

import io
import logging
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from github import GithubException
from github.Repository import Repository
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from bot.core.records import Job, RunStatus
from bot.runners.capacity import Slots
from bot.runners.journal import RunRecords
from bot.runners.specs import ResultRefused, checked_result, finished_status, job_spec
from runner.protocol import JobSpec, ResultSpec
from runner.tasks import DEFAULT_TASK

log = logging.getLogger(__name__)

ARTIFACT_PREFIX = "autoresearch-run-"
QUEUED = frozenset({"queued", "requested", "waiting", "pending"})  # GitHub's statuses before a runner starts


class ActionsSettings(BaseSettings):
    """Where and how runs are dispatched; AUTORESEARCH_ACTIONS_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="AUTORESEARCH_ACTIONS_", env_ignore_empty=True, extra="ignore")

    workflow: str = Field("autoresearch-train.yml", description="the training workflow's file name")
    ref: str = Field("main", description="the branch the workflow is dispatched on (its file is read from there)")
    runners: int = Field(1, ge=1, description="how many self-hosted GPU runners the repository has")
    queue_ahead: int = Field(1, ge=0, description="jobs kept queued on GitHub per runner, so none waits idle")
    queued_limit_s: float = Field(600.0, gt=0, description="a run queued longer is cancelled and dispatched again")
    max_attempts: int = Field(3, ge=1, description="dispatches of one run before it is given up as lost")
    running_limit_s: float = Field(
        7200.0,
        gt=0,
        description="a run in progress longer (its runner gone without a word) is cancelled and dispatched again",
    )
    poll_interval_s: float = Field(15.0, ge=0, description="the least time between two questions about one run")

    @property
    def slots(self) -> int:
        return self.runners * (1 + self.queue_ahead)


class ActionsRunner:
    """`repo()` is the repository (the app gives its GitHub client's), and `pace_write(what)` is called
    before each dispatch ("dispatch") and cancel ("cancel"), to stay under GitHub's write limits."""

    def __init__(
        self,
        repo: Callable[[], Repository],
        state_dir: Path,
        settings: ActionsSettings | None = None,
        *,
        pace_write: Callable[[str], None] = lambda what: None,
        harness: str | None = None,
        clock: Callable[[], float] = time.time,
        slots_file: Path | None = None,
    ) -> None:
        self.settings = settings or ActionsSettings()
        self._runners = Slots(slots_file, self.settings.runners)
        self._repo = repo
        self.records = RunRecords(state_dir / "actions")
        self._pace = pace_write
        self._harness: dict[str, str] = {DEFAULT_TASK: harness} if harness else {}  # task -> its harness hash
        self._clock = clock
        self._seen: dict[int, tuple[float, RunStatus]] = {}  # run id -> (when asked, the answer)
        self._lock = threading.Lock()
        self._notify: Callable[[], None] | None = None

    @property
    def slots(self) -> int:
        """The self-hosted runners (`runners`, or the number an operator wrote to `slots_file`:
        bot.runners.capacity), each with `queue_ahead` more jobs queued on GitHub."""
        return self._runners() * (1 + self.settings.queue_ahead)

    # --- the protocol ----------------------------------------------------------------------------
    def check_ready(self, identity: dict[str, str]) -> None:
        """Nothing to ask before the first dispatch: a workflow GitHub cannot start says so then, and
        a result measured under another identity is refused when it is read."""

    def on_change(self, callback: Callable[[], None]) -> None:
        self._notify = callback

    def notify(self) -> None:
        """A workflow_run or workflow_job event arrived: forget what GitHub said before, and tell
        the conductor's driver to tick. Safe from any thread."""
        with self._lock:
            self._seen.clear()
        if self._notify is not None:
            self._notify()

    def submit(self, job: Job) -> str:
        record = self.records.read(job.run_id)
        if record is not None:
            return record["html_url"]  # dispatched before: one run per id
        spec = job_spec(job, repository=self._repo().full_name)
        if not spec.commit:
            raise ValueError(
                f"run {job.run_id} has no commit: the Actions runner reads train.py from the job's "
                "commit, so the conductor must give one"
            )
        record = {
            "run_id": job.run_id,
            "job": spec.model_dump(mode="json"),
            "attempts": 0,
            "lost_requeues": 0,
            "previous": [],
            "outcome": None,
        }
        self._dispatch(record)
        log.info("run %s dispatched to GitHub Actions: %s", job.run_id, record["html_url"])
        return record["html_url"]

    def lookup(self, run_id: int) -> RunStatus:
        record = self.records.read(run_id)
        if record is None:
            return RunStatus("unknown", detail=f"no run {run_id} was dispatched from {self.records.dir}")
        if record["outcome"] is not None:
            return self._outcome(record)
        with self._lock:
            seen = self._seen.get(run_id)
        if seen is not None and self._clock() - seen[0] < self.settings.poll_interval_s:
            return seen[1]
        status = self._ask(record)
        with self._lock:
            if status.state in ("queued", "running"):
                self._seen[run_id] = (self._clock(), status)
            else:
                self._seen.pop(run_id, None)
        return status

    def close(self) -> None:
        """Nothing held here: the workflow runs go on, and the next bot reads them from its records."""

    def cancel(self, run_id: int) -> None:
        record = self.records.read(run_id)
        if record is None:
            return
        if record["outcome"] is None:
            self._cancel_workflow_run(record["workflow_run_id"])
        record["outcome"] = {"state": "lost", "detail": "cancelled by the bot"}  # it reports nothing afterwards
        self.records.write(record)
        with self._lock:
            self._seen.pop(run_id, None)

    # --- asking GitHub ---------------------------------------------------------------------------
    def _ask(self, record: dict[str, Any]) -> RunStatus:
        repo = self._repo()
        workflow_run_id = record["workflow_run_id"]
        try:
            run = repo.get_workflow_run(workflow_run_id)
        except GithubException as error:
            if error.status == 404:
                return self._lost(record, f"its workflow run {record['html_url']} was deleted")
            raise
        if run.status in QUEUED:
            waited = self._clock() - record["dispatched_at"]
            if waited <= self.settings.queued_limit_s:
                return RunStatus("queued", progress={"actions_url": record["html_url"]})
            self._cancel_workflow_run(workflow_run_id)
            if record["attempts"] >= self.settings.max_attempts:
                return self._give_up(
                    record,
                    f"no self-hosted runner started it in {record['attempts']} dispatches "
                    f"of {self.settings.queued_limit_s:.0f} s each: check that a runner with the "
                    "workflow's labels (repository variable AUTORESEARCH_RUNS_ON) is online",
                )
            log.warning(
                "run %s: workflow run %s queued for %.0f s, more than %.0f s; cancelled, dispatching again",
                record["run_id"],
                record["html_url"],
                waited,
                self.settings.queued_limit_s,
            )
            self._dispatch(record)
            return RunStatus("queued", progress={"actions_url": record["html_url"]})
        if record.get("started_at") is None:
            record["started_at"] = self._clock()
            self.records.write(record)
        queued_s = record["started_at"] - record["dispatched_at"]
        if run.status != "completed":
            ran = self._clock() - record["started_at"]
            if ran > self.settings.running_limit_s:
                self._cancel_workflow_run(workflow_run_id)
                return self._lost(
                    record,
                    f"its workflow run {record['html_url']} was in progress for {ran:.0f} s, past "
                    f"running_limit_s ({self.settings.running_limit_s:.0f} s) and the workflow's own timeout: "
                    "its runner went away without a word; cancelled",
                )
            return RunStatus("running", progress={"actions_url": record["html_url"], "queued_s": round(queued_s, 1)})
        spec = self._download(repo, record)
        if spec is None:
            return self._lost(
                record,
                f"its workflow run {record['html_url']} ended {run.conclusion} without a "
                f"result (no {ARTIFACT_PREFIX}{record['run_id']} artifact with a readable result.json): "
                "its runner went away (taken offline, or it lost touch with GitHub) or a step before "
                "training failed, as the harness uploads a result for every run, train.py's crash included",
            )
        if spec.timings.queued is None:
            spec.timings.queued = round(queued_s, 3)
        record["outcome"] = {"state": "finished", "result": spec.model_dump(mode="json")}
        self.records.write(record)
        return self._outcome(record)

    def _outcome(self, record: dict[str, Any]) -> RunStatus:
        outcome = record["outcome"]
        if outcome["state"] != "finished":
            return RunStatus("lost", detail=outcome["detail"])
        job = JobSpec.model_validate(record["job"])
        try:
            result = checked_result(
                job, ResultSpec.model_validate(outcome["result"]), harness=self._harness_hash(job.task)
            )
        except ResultRefused as error:
            return RunStatus("lost", detail=f"result refused: {error} (workflow run {record['html_url']})")
        result.metrics["actions_url"] = record["html_url"]
        return finished_status(result)

    def _download(self, repo: Repository, record: dict[str, Any]) -> ResultSpec | None:
        """The result.json in the run's artifact, or None when there is none to read."""
        name = f"{ARTIFACT_PREFIX}{record['run_id']}"
        requester = repo._requester  # PyGithub has no artifact name filter nor zip download
        _, listed = requester.requestJsonAndCheck(
            "GET", f"{repo.url}/actions/runs/{record['workflow_run_id']}/artifacts", parameters={"name": name}
        )
        found = [a for a in listed.get("artifacts", []) if a.get("name") == name and not a.get("expired")]
        if not found:
            return None
        try:
            _, _, chunks = requester.getStream(found[0]["archive_download_url"], chunk_size=1 << 16)
            data = b"".join(chunks)
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                return ResultSpec.model_validate_json(archive.read("result.json"))
        except (OSError, KeyError, zipfile.BadZipFile, ValidationError, GithubException) as error:
            log.warning(
                "run %s: the artifact %s of %s could not be read: %s", record["run_id"], name, record["html_url"], error
            )
            return None

    # --- dispatching -----------------------------------------------------------------------------
    def _dispatch(self, record: dict[str, Any]) -> None:
        """Start one more workflow run for the record's job and write the record."""
        job = JobSpec.model_validate(record["job"])
        inputs = dispatch_inputs(job)
        repo = self._repo()
        workflow, ref = self.settings.workflow, self.settings.ref
        self._pace("dispatch")
        try:
            _, answer = repo._requester.requestJsonAndCheck(
                "POST",
                f"{repo.url}/actions/workflows/{quote(workflow, safe='')}/dispatches",
                input={"ref": ref, "inputs": inputs, "return_run_details": True},
            )
        except GithubException as error:
            raise RuntimeError(_dispatch_refused(error, repo.full_name, workflow, ref)) from None
        if not isinstance(answer, dict) or "workflow_run_id" not in answer:
            raise RuntimeError(
                f"GitHub started {workflow} for run {job.run_id} but did not say which workflow run: "
                "this GitHub does not support return_run_details, which the Actions runner needs"
            )
        if record.get("workflow_run_id") is not None:
            record["previous"].append(record["html_url"])
        record.update(
            workflow_run_id=int(answer["workflow_run_id"]),
            html_url=answer["html_url"],
            run_url=answer["run_url"],
            dispatched_at=self._clock(),
            started_at=None,
            attempts=record["attempts"] + 1,
        )
        self.records.write(record)

    def _lost(self, record: dict[str, Any], why: str) -> RunStatus:
        """A workflow run that will never give a result: dispatched again once, then lost."""
        if record["lost_requeues"] < 1:
            log.warning("run %s: %s; dispatching it again (once)", record["run_id"], why)
            record["lost_requeues"] += 1
            self._dispatch(record)
            return RunStatus("queued", progress={"actions_url": record["html_url"]})
        return self._give_up(
            record, f"{why}; it had already been dispatched again once (earlier: {', '.join(record['previous'])})"
        )

    def _give_up(self, record: dict[str, Any], detail: str) -> RunStatus:
        record["outcome"] = {"state": "lost", "detail": detail}
        self.records.write(record)
        log.warning("run %s lost: %s", record["run_id"], detail)
        return RunStatus("lost", detail=detail)

    def _cancel_workflow_run(self, workflow_run_id: int) -> None:
        repo = self._repo()
        self._pace("cancel")
        try:
            repo._requester.requestJsonAndCheck("POST", f"{repo.url}/actions/runs/{workflow_run_id}/cancel")
        except GithubException as error:
            if error.status not in (404, 409):  # 409: it had completed already; 404: deleted
                raise

    # --- the state files -------------------------------------------------------------------------
    def _harness_hash(self, task: str) -> str:
        if task not in self._harness:
            from runner.profiles import harness_hash  # reads the harness sources once per task

            self._harness[task] = harness_hash(task)
        return self._harness[task]


def dispatch_inputs(job: JobSpec) -> dict[str, str]:
    """The workflow_dispatch inputs of one job: its identity only (the workflow reads train.py from
    the commit and checks its sha256)."""
    inputs = {
        "run_id": str(job.run_id),
        "experiment_id": "" if job.experiment_id is None else str(job.experiment_id),
        "commit": job.commit,
        "asset_sha256": job.asset_sha256,
        "profile": job.profile,
        "seed": str(job.seed),
        "protocol_version": str(job.version),
    }
    if job.task != DEFAULT_TASK:  # only then: a workflow of the release before tasks has no such input
        inputs["task"] = job.task
    return inputs


def _dispatch_refused(error: GithubException, repository: str, workflow: str, ref: str) -> str:
    message = error.data.get("message", "") if isinstance(error.data, dict) else ""
    if error.status == 404:
        return (
            f"GitHub has no workflow {workflow} on {ref} of {repository}: commit .github/workflows/{workflow} "
            f"from this project to {ref}, or set AUTORESEARCH_ACTIONS_WORKFLOW / AUTORESEARCH_ACTIONS_REF"
        )
    if error.status == 403:
        return (
            f"GitHub refused to start {workflow} on {repository} ({message}): the bot needs the "
            "Actions: write permission"
        )
    if error.status == 422:
        return (
            f"GitHub refused to start {workflow} on {ref} of {repository}: {message}. The workflow file "
            "there must declare the inputs this bot sends (update it from this project)"
        )
    return f"GitHub did not start {workflow} on {repository}: HTTP {error.status} {message}"
