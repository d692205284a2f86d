"""What people see of each experiment on GitHub: its pull request, its `val_bpb` check, its label,
the comment that explains its decision, and the answers to their commands.

The publisher is level-triggered: each tick it compares what the store says an experiment is
with what it has already shown (the store's `published` rows) and makes up the difference, one
idempotent call at a time. It never decides anything and never changes the lifecycle, so GitHub
being down delays what people see, not the research. Every object it creates is found again
before it is created a second time: a pull request by its head branch, a check run by its
`external_id`, a comment by the hidden marker in its text (bot.github.render). A run in progress
updates its check at most once every `progress_every_s` seconds.

With a personal access token GitHub refuses check runs; the publisher then sets a commit status
with the same context instead (its description holds at most 140 characters).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from github import GithubException
from github.Repository import Repository

from bot.conductor import Publisher, Snapshot
from bot.github import render
from bot.github.research_log import ResearchLog
from bot.states import RunState, State
from bot.store import Experiment, Store, failpoint

__all__ = ["GitHubPublisher", "CHECK_NAME"]

log = logging.getLogger(__name__)

CHECK_NAME = "autoresearch / val_bpb"
ACTIONS = [
    {"label": "Re-run", "description": "Measure it once more", "identifier": "rerun"},
    {"label": "Keep anyway", "description": "Merge it once measured on main", "identifier": "keep"},
    {"label": "Discard", "description": "Stop it and close the PR", "identifier": "discard"},
]
STATUS_STATE = {"queued": "pending", "in_progress": "pending", "keep": "success", "discard": "success",
                "crash": "failure", "failed": "error", "cancelled": "error"}


class GitHubPublisher(Publisher):
    def __init__(self, store: Store, repo: Repository, *, read_file: Callable[[str, str], str], uses_app: bool,
                 main_branch: str = "main", pace_write: Callable[[], None] = lambda: None,
                 progress_every_s: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.repo = repo
        self.read_file = read_file
        self.uses_app = uses_app
        self.main_branch = main_branch
        self.pace_write = pace_write
        self.progress_every_s = progress_every_s
        self.clock = clock
        self._shown: dict[int, tuple[Any, ...]] = {}  # experiment -> what was last shown of it (this process)
        self._progress_at: dict[int, float] = {}  # experiment -> when its progress was last shown
        self._labels_ready: set[str] = set()
        self._checks: dict[int, Any] = {}  # check run id -> CheckRun object, to update it without a read
        self.research_log = ResearchLog(store, repo, pace_write=pace_write, clock=clock)

    # --- the phase ---------------------------------------------------------------------------------
    def publish(self, snapshot: Snapshot) -> None:
        failures: list[str] = []
        try:
            self._post_replies()
        except Exception as error:  # noqa: BLE001 - replies wait for the next tick
            failures.append(f"replies: {type(error).__name__}: {error}")
        for exp in self.store.unpublished():
            try:
                self._publish(exp, snapshot)
            except Exception as error:  # noqa: BLE001 - one experiment's trouble must not hold up the others
                self._shown.pop(exp.id, None)
                failures.append(f"experiment {exp.id}: {type(error).__name__}: {error}")
        try:
            self.research_log.update()
        except Exception as error:  # noqa: BLE001 - the log catches up at the next tick
            failures.append(f"research log: {type(error).__name__}: {error}")
        if failures:
            raise RuntimeError("; ".join(failures))

    def _publish(self, exp: Experiment, snapshot: Snapshot) -> None:
        running = [r for r in self.store.runs(experiment_id=exp.id) if r.state == RunState.RUNNING]
        phase = "completed" if exp.state == State.DONE else ("in_progress" if running else "queued")
        progress = snapshot.progress.get(running[0].id) if running else None
        due = phase == "in_progress" and progress and \
            self.clock() - self._progress_at.get(exp.id, 0.0) >= self.progress_every_s
        shown = (exp.state, exp.status, exp.head_sha, phase)
        if self._shown.get(exp.id) == shown and not due:
            return
        published = self.store.published(exp.id)
        if exp.id not in self._shown and exp.state != State.DONE and "pr" in published:
            if self._closed_while_away(exp, int(published["pr"])):
                return
        if exp.state != State.DONE and published.get("final"):  # reopened: a new round of checks and comments
            self._reopen(exp, int(published["pr"]))
            round_ = str(int(published.get("round", "0")) + 1)
            self.store.set_published(exp.id, "round", round_)
            self.store.set_published(exp.id, "final", "")
            published = self.store.published(exp.id)
        number = self._pull_request(exp, published, snapshot)
        self._label(exp, number, published)
        self._check(exp, published, phase, progress, snapshot)
        if exp.state == State.DONE:
            self._decision(exp, number, published, snapshot)
            self._close(exp, number)
            self.store.set_published(exp.id, "final", exp.status or "")
        if phase == "in_progress" and progress:
            self._progress_at[exp.id] = self.clock()
        self._shown[exp.id] = shown

    # --- the pull request ----------------------------------------------------------------------------
    def _pull_request(self, exp: Experiment, published: dict[str, str], snapshot: Snapshot) -> int:
        if "pr" in published:
            return int(published["pr"])
        owner = self.repo.owner.login
        existing = list(self.repo.get_pulls(state="all", head=f"{owner}:{exp.branch}"))
        if existing:
            number = existing[0].number
        else:
            history = [e for e in self.store.experiments(state=State.DONE) if e.id != exp.id][-5:]
            body = render.pr_body(exp, main_sha=exp.base_sha, main_val_bpb=snapshot.main_val_bpb,
                                  base_train_py=self._base_text(exp), history=history)
            self.pace_write()
            number = self.repo.create_pull(base=self.main_branch, head=exp.branch or "", title=render.pr_title(exp),
                                           body=body).number
            failpoint("pull_request_created")  # the crash tests: created on GitHub, not yet in the store
            log.info("experiment %s: opened pull request #%s", exp.id, number)
        self.store.set_published(exp.id, "pr", str(number))
        published["pr"] = str(number)
        return number

    def _reopen(self, exp: Experiment, number: int) -> None:
        """A finished experiment measured again (/rerun, Keep anyway) gets its pull request back open."""
        pull = self.repo.get_pull(number)
        if pull.state == "closed" and not pull.merged:
            self.pace_write()
            pull.edit(state="open")
            log.info("experiment %s: reopened pull request #%s", exp.id, number)

    def _closed_while_away(self, exp: Experiment, number: int) -> bool:
        """Reconcile after a start: a pull request a person closed while the bot was not listening
        (a webhook GitHub could not deliver) cancels its experiment as the webhook would have."""
        pull = self.repo.get_pull(number)
        if pull.state != "closed" or pull.merged or exp.request:
            return False
        closer = pull.as_issue().closed_by
        self.store.request(exp.id, "cancel", closer.login if closer else "someone (while the bot was away)")
        log.info("experiment %s: its pull request #%s was closed while the bot was away", exp.id, number)
        return True

    def _base_text(self, exp: Experiment) -> str:
        try:
            return self.read_file(exp.base_sha, "train.py")
        except FileNotFoundError:
            return ""

    def _label(self, exp: Experiment, number: int, published: dict[str, str]) -> None:
        wanted = render.LABELS["running" if exp.state != State.DONE else (exp.status or "failed")]
        if published.get("label") == wanted.name:
            return
        self._ensure_label(wanted)
        issue = self.repo.get_issue(number)
        for label in issue.labels:
            if label.name.startswith("autoresearch: ") and label.name != wanted.name:
                self.pace_write()
                try:
                    issue.remove_from_labels(label.name)
                except GithubException as error:
                    if error.status != 404:
                        raise
        if wanted.name not in {label.name for label in issue.labels}:
            self.pace_write()
            issue.add_to_labels(wanted.name)
        self.store.set_published(exp.id, "label", wanted.name)

    def _ensure_label(self, label: render.Label) -> None:
        if label.name in self._labels_ready:
            return
        try:
            self.repo.get_label(label.name)
        except GithubException as error:
            if error.status != 404:
                raise
            self.pace_write()
            try:
                self.repo.create_label(label.name, label.color, label.description)
            except GithubException as again:
                if again.status != 422:  # 422: someone created it meanwhile
                    raise
        self._labels_ready.add(label.name)

    def _decision(self, exp: Experiment, number: int, published: dict[str, str], snapshot: Snapshot) -> None:
        key = f"comment:decision:{published.get('round', '0')}"
        if key in published:
            return
        runs = self.store.runs(experiment_id=exp.id)
        body = render.decision_comment(exp, main_val_bpb=exp.meta.get("main_val_bpb", snapshot.main_val_bpb),
                                       runs=runs)
        wanted = render.find_marker(body)
        issue = self.repo.get_issue(number)
        found = next((c for c in issue.get_comments() if render.find_marker(c.body) == wanted), None)
        if found is None:
            self.pace_write()
            found = issue.create_comment(body)
            failpoint("comment_posted")
        self.store.set_published(exp.id, key, str(found.id))

    def _close(self, exp: Experiment, number: int) -> None:
        pull = self.repo.get_pull(number)
        if pull.state == "open" and not pull.merged:
            self.pace_write()
            pull.edit(state="closed")
            log.info("experiment %s: closed pull request #%s (%s)", exp.id, number, exp.status)

    # --- the val_bpb check -----------------------------------------------------------------------------
    def _check(self, exp: Experiment, published: dict[str, str], phase: str, progress: dict[str, Any] | None,
               snapshot: Snapshot) -> None:
        head = exp.head_sha or ""
        status = exp.status if phase == "completed" else phase
        title = render.check_title(exp, status=status or "failed", progress=progress)
        if phase == "completed":
            runs = self.store.runs(experiment_id=exp.id)
            summary = render.check_summary(exp, runs, main_val_bpb=exp.meta.get("main_val_bpb", snapshot.main_val_bpb),
                                           noise_margin=exp.margin)
            tails = [r.log_tail for r in runs if r.log_tail]
            text = render.check_text(tails[-1] if tails else exp.error_tail or "")
        else:
            summary = render.progress_summary(progress, snapshot.budget_s) if progress else title
            text = ""
        if not self.uses_app:
            self._status(exp, head, status or "failed", title)
            return
        round_ = published.get("round", "0")
        key = f"check:{head}:{round_}"
        for old in [k for k in published if k.startswith("check:") and k != key and ":done" not in k]:
            self._supersede(exp, old, published)
        output = {"title": title, "summary": summary}
        if text:
            output["text"] = text
        fields: dict[str, Any] = {"status": phase, "output": output, "actions": ACTIONS}
        if phase == "completed":
            fields["conclusion"] = render.conclusion(exp.status or "failed")
        check_id = published.get(key)
        if check_id is None:
            check = self._find_check(head, f"autoresearch:{exp.id}:{round_}")
            if check is None:
                self.pace_write()
                check = self.repo.create_check_run(CHECK_NAME, head, external_id=f"autoresearch:{exp.id}:{round_}",
                                                   **fields)
                failpoint("check_run_created")
                log.info("experiment %s: check run %s on %s (%s)", exp.id, check.id, head[:7], phase)
            self._checks[check.id] = check
            self.store.set_published(exp.id, key, str(check.id))
            published[key] = str(check.id)
            if check.status == phase and phase != "completed":
                return
        check = self._checks.get(int(published[key])) or self.repo.get_check_run(int(published[key]))
        self._checks[check.id] = check
        self.pace_write()
        check.edit(**fields)
        if phase == "completed":
            self.store.set_published(exp.id, key + ":done", "1")

    def _find_check(self, head: str, external_id: str) -> Any | None:
        for check in self.repo.get_commit(head).get_check_runs(check_name=CHECK_NAME):
            if check.external_id == external_id:
                return check
        return None

    def _supersede(self, exp: Experiment, key: str, published: dict[str, str]) -> None:
        """A check on a commit the experiment left (rebased onto a newer main) ends as neutral."""
        if published.get(key + ":done"):
            return
        check = self._checks.get(int(published[key])) or self.repo.get_check_run(int(published[key]))
        if check.status != "completed":
            self.pace_write()
            check.edit(status="completed", conclusion="neutral",
                       output={"title": "superseded: rebased onto a newer main and measured again",
                               "summary": f"Experiment {exp.id} now lives on {exp.head_sha}."})
        self.store.set_published(exp.id, key + ":done", "1")
        published[key + ":done"] = "1"

    def _status(self, exp: Experiment, head: str, status: str, title: str) -> None:
        """The fallback without an App: a commit status (latest per context wins, so it is idempotent)."""
        description = render.status_description(exp, status=status)
        self.pace_write()
        self.repo.get_commit(head).create_status(STATUS_STATE.get(status, "error"), description=description,
                                                 context=CHECK_NAME)

    # --- answers to commands ---------------------------------------------------------------------------
    def _post_replies(self) -> None:
        for comment_id, number, body in self.store.pending_replies():
            issue = self.repo.get_issue(number)
            try:
                comment = issue.get_comment(comment_id)
            except GithubException as error:
                if error.status != 404:
                    raise
                log.info("command comment %s on #%s is gone: no reply", comment_id, number)
                self.store.mark_replied(comment_id)
                continue
            self.pace_write()
            comment.create_reaction("+1")  # GitHub answers 200 with the same reaction when it exists
            wanted = render.find_marker(body)
            if not any(render.find_marker(c.body) == wanted for c in issue.get_comments()):
                self.pace_write()
                issue.create_comment(body)
            self.store.mark_replied(comment_id)
