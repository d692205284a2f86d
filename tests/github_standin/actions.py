"""GitHub Actions in the stand-in: workflow runs dispatched from the repository's own workflow
files, executed by emulated self-hosted runners on background threads (workflow.py runs the
steps), their artifacts, and the knobs a test turns (hold runs queued, lose the next run).

A run moves queued -> in_progress -> completed, as on GitHub; its conclusion is success, failure
or cancelled. A runner picks the oldest queued run whose `runs-on` labels it carries, one run at
a time. Everything here is guarded by the state's lock; steps run outside it.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import shutil
import sys
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import workflow as wf
from .errors import ApiError, not_found, unprocessable
from .state import State

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # runner.isolated is importable from here
RUNNER_LABELS = ("self-hosted", "linux", "x64", "gpu")
ARTIFACT_RETENTION_S = 90 * 24 * 3600.0
LOG_LIMIT = 200_000  # characters of a run's log kept for a test's messages


@dataclass
class WorkflowRun:
    id: int
    run_number: int
    workflow_id: int
    path: str  # .github/workflows/<file>
    name: str
    display_title: str
    head_branch: str
    head_sha: str
    actor: str
    inputs: dict[str, str]
    document: dict[str, Any]
    created_at: float
    updated_at: float
    status: str = "queued"  # queued -> in_progress -> completed
    conclusion: str | None = None
    run_started_at: float | None = None
    runner: str | None = None
    cancel_requested: bool = False
    artifacts: list[int] = field(default_factory=list)
    log: str = ""


@dataclass
class Artifact:
    id: int
    run_id: int
    name: str
    data: bytes
    created_at: float
    head_branch: str
    head_sha: str


def machine_env() -> dict[str, str]:
    """A self-hosted runner machine's environment: the test's own, less anything GitHub sets per
    job, with this project preinstalled (its venv first on PATH, its root on PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(PROJECT_ROOT), env.get("PYTHONPATH", "")] if p)
    env["AUTORESEARCH_PREINSTALLED"] = "1"
    return env


class Actions:
    def __init__(self, st: State, root: Path, runners: int = 1, labels: tuple[str, ...] = RUNNER_LABELS):
        self.st = st
        self.root = root
        self.labels = {label.lower() for label in labels}
        self.variables: dict[str, str] = {}  # repository variables: the `vars` context
        self.machine_env: dict[str, str] = {}  # more variables on the runner machines (over machine_env())
        self.runs: dict[int, WorkflowRun] = {}
        self.artifacts: dict[int, Artifact] = {}
        self.held = False
        self.lose_next = 0  # the next N runs picked up end in failure without running a step
        self._workflow_ids: dict[str, int] = {}
        self._ids = {
            "run": itertools.count(9_100_000_001),
            "artifact": itertools.count(4_400_001),
            "workflow": itertools.count(161_335),
        }
        self._numbers = itertools.count(1)
        self._changed = threading.Condition(st.lock)
        self._stopping = threading.Event()
        self._count = runners
        self._threads: list[threading.Thread] = []

    # lifecycle ------------------------------------------------------------------------------

    def _ensure_runners(self) -> None:
        if self._threads:
            return
        for n in range(self._count):
            thread = threading.Thread(
                target=self._serve, args=(f"standin-runner-{n + 1}",), daemon=True, name=f"standin-runner-{n + 1}"
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            for run in self.runs.values():
                run.cancel_requested = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)

    # the API's side -------------------------------------------------------------------------

    def workflow_id(self, path: str) -> int:
        if path not in self._workflow_ids:
            self._workflow_ids[path] = next(self._ids["workflow"])
        return self._workflow_ids[path]

    def dispatch(self, workflow: str, ref: str, inputs: dict[str, Any], actor: str) -> WorkflowRun:
        """POST .../dispatches: GitHub's checks, then a queued run of the workflow file at `ref`."""
        st = self.st
        with self._changed:
            path = self._workflow_path(workflow)
            refs = st.refs()  # a branch or a tag, never a bare sha
            ref = ref.removeprefix("refs/heads/")
            sha = refs.get(f"refs/heads/{ref}") or refs.get(f"refs/tags/{ref.removeprefix('refs/tags/')}")
            if sha is None:
                raise unprocessable(f"No ref found for: {ref}")
            entry = st.repo.entry(sha, path)
            if entry is None or entry.type != "blob":
                raise not_found()
            try:
                document = yaml.safe_load(st.repo.read_blob(entry.sha))
            except yaml.YAMLError as error:
                raise unprocessable(f"Invalid workflow file: {error}") from None
            triggers = document.get(True, document.get("on"))  # YAML 1.1 reads the key `on` as True
            dispatch = (
                triggers.get("workflow_dispatch", "absent")
                if isinstance(triggers, dict)
                else (None if triggers == "workflow_dispatch" or "workflow_dispatch" in (triggers or []) else "absent")
            )
            if dispatch == "absent":
                raise unprocessable("Workflow does not have 'workflow_dispatch' trigger")
            declared = (dispatch or {}).get("inputs") or {}
            unexpected = sorted(set(inputs) - set(declared))
            if unexpected:
                raise unprocessable(f"Unexpected inputs provided: {unexpected}")
            values = {}
            for name, spec in declared.items():
                if name in inputs:
                    values[name] = wf.as_text(inputs[name])
                elif (spec or {}).get("required") and "default" not in (spec or {}):
                    raise unprocessable(f"Required input '{name}' not provided")
                else:
                    values[name] = wf.as_text((spec or {}).get("default", ""))
            now = st.clock()
            run_id = next(self._ids["run"])
            run = WorkflowRun(
                id=run_id,
                run_number=next(self._numbers),
                workflow_id=self.workflow_id(path),
                path=path,
                name=str(document.get("name") or path),
                display_title="",
                head_branch=ref,
                head_sha=sha,
                actor=actor,
                inputs=values,
                document=document,
                created_at=now,
                updated_at=now,
            )
            run.display_title = wf.as_text(wf.substitute(document.get("run-name") or run.name, self._contexts(run)))
            self.runs[run_id] = run
            self._ensure_runners()
            self._changed.notify_all()
            return run

    def run(self, run_id: int) -> WorkflowRun:
        run = self.runs.get(run_id)
        if run is None:
            raise not_found()
        return run

    def cancel(self, run_id: int) -> None:
        with self._changed:
            run = self.run(run_id)
            if run.status == "completed":
                raise ApiError(409, "Cannot cancel a workflow run that is completed.")
            run.cancel_requested = True
            if run.status == "queued":
                self._complete(run, "cancelled")
            self._changed.notify_all()

    def delete(self, run_id: int) -> None:
        with self._changed:
            run = self.runs.pop(run_id, None)
            if run is None:
                raise not_found()
            run.cancel_requested = True
            for artifact_id in run.artifacts:
                self.artifacts.pop(artifact_id, None)
            self._changed.notify_all()

    def artifact(self, artifact_id: int) -> Artifact:
        artifact = self.artifacts.get(artifact_id)
        if artifact is None:
            raise not_found()
        return artifact

    # the test's knobs -----------------------------------------------------------------------

    def hold(self) -> None:
        """Leave queued runs queued (no runner picks them up) until release()."""
        with self._changed:
            self.held = True

    def release(self) -> None:
        with self._changed:
            self.held = False
            self._changed.notify_all()

    def lose(self, count: int = 1) -> None:
        """The runner that picks up each of the next `count` runs dies: the run fails, no step runs."""
        with self._changed:
            self.lose_next += count

    def wait(self, run_id: int, status: str = "completed", timeout: float = 120.0) -> WorkflowRun:
        """Block until the run reaches `status` (for tests); its record."""
        with self._changed:
            if not self._changed.wait_for(
                lambda: self.runs.get(run_id) is None or self.runs[run_id].status == status, timeout
            ):
                raise TimeoutError(
                    f"workflow run {run_id} is still {self.runs[run_id].status}; its log:\n"
                    f"{self.runs[run_id].log[-4000:]}"
                )
            return self.run(run_id)

    # the emulated runners -------------------------------------------------------------------

    def _serve(self, name: str) -> None:
        while not self._stopping.is_set():
            with self._changed:
                run = self._next_run()
                if run is None:
                    self._changed.wait(0.2)
                    continue
                run.status, run.runner = "in_progress", name
                run.run_started_at = run.updated_at = self.st.clock()
                lose = self.lose_next > 0
                self.lose_next -= lose
                self._changed.notify_all()
            if lose:
                with self._changed:
                    run.log += "The runner has received a shutdown signal.\n"
                    self._complete(run, "failure")
                continue
            self._execute(run)

    def _next_run(self) -> WorkflowRun | None:
        if self.held:
            return None
        for run in sorted(self.runs.values(), key=lambda r: r.id):
            if run.status == "queued" and self._runs_here(run):
                return run
        return None

    def _runs_here(self, run: WorkflowRun) -> bool:
        job = next(iter((run.document.get("jobs") or {}).values()), {})
        try:
            wanted = wf.substitute(job.get("runs-on", []), self._contexts(run))
        except wf.ExpressionError:
            return False
        wanted = [wanted] if isinstance(wanted, str) else list(wanted or [])
        return {str(label).lower() for label in wanted} <= self.labels

    def _execute(self, run: WorkflowRun) -> None:
        workspace = self.root / "actions" / str(run.id) / "workspace"
        job = wf.JobRun(
            workflow=run.document,
            contexts=self._contexts(run, workspace),
            workspace=workspace,
            machine_env={**machine_env(), **self.machine_env, **self._github_env(run, workspace)},
            checkout=self._checkout,
            upload=lambda name, data: self._upload(run, name, data),
            cancelled=lambda: run.cancel_requested,
        )
        try:
            conclusion = job.run()
        except Exception as error:  # noqa: BLE001 - the emulator's own failure fails the run, loudly
            job.log.append(f"the stand-in's runner failed: {error!r}")
            conclusion = "failure"
        with self._changed:
            run.log += "\n".join(job.log)[-LOG_LIMIT:]
            self._complete(run, conclusion)
        shutil.rmtree(workspace, ignore_errors=True)

    def _complete(self, run: WorkflowRun, conclusion: str) -> None:
        run.status, run.conclusion, run.updated_at = "completed", conclusion, self.st.clock()
        self._changed.notify_all()

    def _checkout(self, ref: str, destination: Path) -> None:
        with self.st.lock:
            sha = self.st.repo.resolve(ref)
            if sha is None:
                raise RuntimeError(f"A branch or tag with the name '{ref}' could not be found")
            archive = self.st.repo.git("archive", "--format=tar", sha)
        destination.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(destination, filter="data")

    def _upload(self, run: WorkflowRun, name: str, data: bytes) -> None:
        with self._changed:
            if any(self.artifacts[a].name == name for a in run.artifacts if a in self.artifacts):
                raise RuntimeError(f"an artifact named {name} already exists in this run")
            artifact = Artifact(
                id=next(self._ids["artifact"]),
                run_id=run.id,
                name=name,
                data=data,
                created_at=self.st.clock(),
                head_branch=run.head_branch,
                head_sha=run.head_sha,
            )
            self.artifacts[artifact.id] = artifact
            run.artifacts.append(artifact.id)

    def _workflow_path(self, workflow_id: str) -> str:
        if re.fullmatch(r"\d+", workflow_id):
            path = next((p for p, i in self._workflow_ids.items() if i == int(workflow_id)), None)
            if path is None:
                raise not_found()
            return path
        return f".github/workflows/{workflow_id}"

    def _contexts(self, run: WorkflowRun, workspace: Path | None = None) -> dict[str, Any]:
        st = self.st
        return {
            "github": {
                "run_id": str(run.id),
                "run_number": str(run.run_number),
                "run_attempt": "1",
                "repository": f"{st.owner}/{st.name}",
                "repository_owner": st.owner,
                "server_url": st.base_url,
                "api_url": st.base_url,
                "sha": run.head_sha,
                "ref": f"refs/heads/{run.head_branch}",
                "ref_name": run.head_branch,
                "event_name": "workflow_dispatch",
                "actor": run.actor,
                "workflow": run.name,
                "workspace": str(workspace or ""),
                "event": {"inputs": dict(run.inputs)},
            },
            "inputs": dict(run.inputs),
            "vars": dict(self.variables),
            "secrets": {},
            "runner": {"os": "Linux", "arch": "X64", "environment": "self-hosted"},
        }

    def _github_env(self, run: WorkflowRun, workspace: Path) -> dict[str, str]:
        st = self.st
        temp = workspace.parent / "temp"
        temp.mkdir(parents=True, exist_ok=True)
        return {
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_SERVER_URL": st.base_url,
            "GITHUB_API_URL": st.base_url,
            "GITHUB_REPOSITORY": f"{st.owner}/{st.name}",
            "GITHUB_REPOSITORY_OWNER": st.owner,
            "GITHUB_RUN_ID": str(run.id),
            "GITHUB_RUN_NUMBER": str(run.run_number),
            "GITHUB_RUN_ATTEMPT": "1",
            "GITHUB_SHA": run.head_sha,
            "GITHUB_REF": f"refs/heads/{run.head_branch}",
            "GITHUB_REF_NAME": run.head_branch,
            "GITHUB_EVENT_NAME": "workflow_dispatch",
            "GITHUB_ACTOR": run.actor,
            "GITHUB_WORKFLOW": run.name,
            "GITHUB_WORKSPACE": str(workspace),
            "RUNNER_OS": "Linux",
            "RUNNER_ARCH": "X64",
            "RUNNER_ENVIRONMENT": "self-hosted",
            "RUNNER_TEMP": str(temp),
        }
