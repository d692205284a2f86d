"""What people see of each experiment on GitHub: its pull request, its check (named after the
task's metric: `autoresearch / val_bpb` for training, as before tasks, `autoresearch / p95_ms`...),
its verdict label, the comment that explains its decision, and the answers to their commands; every
number in the task's metric (bot.github.render), the task read from the store (the loop's pinned one).

The publisher is level-triggered: each tick it compares what the store says an experiment is
with what it has already shown (the store's `published` rows) and makes up the difference, one
idempotent call at a time. It never decides anything and never changes the lifecycle, so GitHub
being down delays what people see, not the research. Nothing it creates is created twice: before
each create it notes the attempt in the store (`attempt:<key>`), and only a create with such a note
and no result (an answer lost to a crash, a 502, a timeout) looks first for what it may have made:
a pull request by its head branch, a check run by its `external_id`, a comment by the hidden marker
in its text (bot.github.render), each only among what the bot's own login authored (its pull
requests and comments, check runs of its own App): anyone can write a marker into a comment, and
another App can create a check run with any external_id. A create never tried before goes straight
to GitHub. The answers to people's commands are posted first, each pass (bot.github.replies).

Calls per experiment. GitHub allows 500 content-creating requests an hour and 80 a minute
(bench/github_api.py); every write here waits for room in the write budget (bot.github.budget, on
the publisher's own thread: the research's writes go first). Writes go to the numbers and ids the
store keeps, never through a read of the object first; the verdict label and the close of the pull
request are one PATCH of its issue, after one GET for the labels people added (kept). An experiment
in flight has no label. Its check run is created when it is first shown only for a long run
(`short_run_s`, SHORT_RUN_S: more than 10 minutes) while the budget is full and has room
(PROGRESS_ROOM writes); it then shows the run in progress, updated at most every `progress_every_s`
(PROGRESS_EVERY_S, 120 s). A shorter run's check, or any while the budget is tight, is created once,
in its final state, when the experiment ends. So in full mode an experiment costs 6 writes (its
branch 2, the forge's; pull request, check run, decision comment, label and close 1 each), 7 when
kept (main's fast-forward), 1 more with the Actions runner (its dispatch); a reopened one 1-2 more.
With a runner that carries the asset in its job (local, Modal), an experiment's branch, and so its
pull request, comes once a run of it has started (bot.github.branches): a proposal that waits for a
runner shows nothing yet, and one that a keep overtakes before it ran is re-grafted without a write.

Degraded mode. When showing every experiment in full would take more than 90% of the hour's 500
writes at the recent pace (bot.github.budget's forecast), the mode turns degraded until it falls
under 70%; `autoresearch status` and the dashboard show it, since when and why. Then:
- every experiment is still run, judged and recorded in the store, and main fast-forwarded for a
  keep: the research never waits on it. Its branch is made and kept where the runner fetches it
  (Actions); with a runner that carries the asset (local, Modal) only a promising or kept one gets
  a branch (bot.github.branches), and the others are listed with their diff instead of a commit;
- an experiment gets its pull request, check run and decision comment only when it is kept or
  promising (the judge asked to confirm it, as it does before most keeps), or when it was shown on
  a pull request already (that one is shown to its end);
- the rest (discarded, crashed, rejected) get no pull request: they are listed once in the research
  log, one comment for a batch of up to 20 (bot.github.summaries), with their verdict, value, change,
  reason and a link to their commit. One that later needs a pull request (reopened, promising) gets
  one, once.
A kept experiment that main took before its pull request was opened (in degraded mode the
usual case: it is known to be kept only when the judge says so, and main moves in the same tick)
cannot have one: GitHub refuses a pull request for a branch main holds. In full mode a keep waits
for its pull request before main takes it (`pull_request_first`, the lifecycle's merge gate; its
pull request is made first in the next pass), while the write budget has room for it now and at
most bot.loop.merge_gate's MERGE_WAIT_S (60 s): only a publisher failing that long, or writes
held back by the limits, lose it. Its check run is made on its commit, now main's, and it is listed once in the
research log like the others, besides the log's table of kept changes.
What a person loses while it lasts: no pull request (so no check run, labels, review, Re-run /
Keep anyway buttons or /commands on it) for an experiment that is neither kept nor promising, and
its notification comes as a line in a batch rather than its own; no check run while a run trains.
The dashboard and `autoresearch results` still show every experiment.

With a personal access token GitHub refuses check runs; the publisher then sets a commit status
with the same context instead (its description holds at most 140 characters).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from github import GithubException
from github.Repository import Repository

from bot.core.errors import PublishingStopped
from bot.core.protocols import Publisher, Snapshot
from bot.core.states import RunState, State, Status
from bot.github import render
from bot.github.budget import WriteBudget
from bot.github.replies import Replies
from bot.github.research_log import ResearchLog
from bot.github.summaries import Summaries, change_diff
from bot.github.webhooks import GitHubEvent
from bot.store import Experiment, Store, failpoint
from bot.views.read_model import read_loop, task_of
from runner.tasks import TRAINING, Metric, Task

__all__ = ["GitHubPublisher", "CHECK_NAME", "check_name", "pull_request_first"]

log = logging.getLogger(__name__)


def check_name(metric: Metric) -> str:
    """The check's (and the commit status's context's) name: `autoresearch / <metric>`."""
    return f"autoresearch / {metric.name}"


CHECK_NAME = check_name(TRAINING.metric)  # training's, unchanged since before tasks: "autoresearch / val_bpb"
PROGRESS_EVERY_S = 120.0  # the check's progress updates while a run trains (see the module docstring)
SHORT_RUN_S = 600.0  # a run this long or shorter gets its check once, in its final state
PROGRESS_ROOM = 10  # writes the budget must have free for a check to show a run in progress
ACTIONS = [
    {"label": "Re-run", "description": "Measure it once more", "identifier": "rerun"},
    {"label": "Keep anyway", "description": "Merge it once measured on main", "identifier": "keep"},
    {"label": "Discard", "description": "Stop it and close the PR", "identifier": "discard"},
]
STATUS_STATE = {
    "queued": "pending",
    "in_progress": "pending",
    "keep": "success",
    "discard": "success",
    "crash": "failure",
    "rejected": "failure",
    "failed": "error",
    "cancelled": "error",
}


class GitHubPublisher(Publisher):
    def __init__(
        self,
        store: Store,
        repo: Repository,
        *,
        read_file: Callable[[str, str], str],
        uses_app: bool,
        main_branch: str = "main",
        budget: WriteBudget | None = None,
        progress_every_s: float = PROGRESS_EVERY_S,
        short_run_s: float = SHORT_RUN_S,
        clock: Callable[[], float] = time.time,
        on_pull_request: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.repo = repo
        self.on_pull_request = on_pull_request  # told when a pull request is opened: a keep may wait for it
        self.read_file = read_file
        self.uses_app = uses_app
        self.main_branch = main_branch
        self.budget = budget  # None: writes are neither counted nor paced (a test's)
        self.progress_every_s = progress_every_s
        self.short_run_s = short_run_s
        self.clock = clock
        self._shown: dict[int, tuple[Any, ...]] = {}  # experiment -> what was last shown of it (this process)
        self._progress_at: dict[int, float] = {}  # experiment -> when its progress was last shown
        self._labels_ready: set[str] = set()
        self.research_log = ResearchLog(store, repo, pace_write=self.pace_write, clock=clock)
        self.replies = Replies(store, repo, pace_write=self.pace_write)
        self.summaries = Summaries(
            store,
            repo,
            pace_write=self.pace_write,
            clock=clock,
            change=lambda exp: change_diff(self._base_text(exp), exp.asset, self.task.asset),
        )
        self.degraded = False  # the budget's mode as this pass decided it
        self.task: Task = TRAINING  # the loop's, read again at each publish

    @property
    def check_name(self) -> str:
        return check_name(self.task.metric)

    def pace_write(self, what: str) -> float:
        """Wait for room in the write budget for one write people read (this publisher's thread only)."""
        return self.budget.wait(what) if self.budget is not None else 0.0

    # --- the phase ---------------------------------------------------------------------------------
    def publish(self, snapshot: Snapshot) -> None:
        self.task = task_of(read_loop(self.store.db))
        was = self.degraded
        self.degraded = self.budget is not None and self.budget.decide_mode().mode == "degraded"
        failures: list[str] = []
        try:
            self.replies.post()
        except PublishingStopped:  # the service stops: what is left is shown after the next start
            raise
        except Exception as error:  # noqa: BLE001 - replies wait for the next tick
            failures.append(f"replies: {type(error).__name__}: {error}")
        behind = self.store.published.behind()
        for exp in sorted(behind, key=lambda e: e.state != State.MERGING):  # a keep waits for its pull request
            try:
                self._publish(exp, snapshot)
            except PublishingStopped:
                self._shown.pop(exp.id, None)
                raise
            except Exception as error:  # noqa: BLE001 - one experiment's trouble must not hold up the others
                self._shown.pop(exp.id, None)
                failures.append(f"experiment {exp.id}: {type(error).__name__}: {error}")
        try:
            self.research_log.update()
            self.summaries.post(self.task.metric, flush=was and not self.degraded)
        except PublishingStopped:
            raise
        except Exception as error:  # noqa: BLE001 - the log catches up at the next tick
            failures.append(f"research log: {type(error).__name__}: {error}")
        if failures:
            raise RuntimeError("; ".join(failures))

    def _publish(self, exp: Experiment, snapshot: Snapshot) -> None:
        runs = self.store.runs.all(experiment_id=exp.id)
        running = [r for r in runs if r.state == RunState.RUNNING]
        phase = "completed" if exp.state == State.DONE else ("in_progress" if running else "queued")
        progress = snapshot.progress.get(running[0].id) if running else None
        due = (
            phase == "in_progress"
            and progress
            and self.clock() - self._progress_at.get(exp.id, 0.0) >= self.progress_every_s
        )
        shown = (exp.state, exp.status, exp.head_sha, phase, self.degraded, exp.reopened)
        if self._shown.get(exp.id) == shown and not due:
            return
        published = self.store.published.get(exp.id)
        if exp.id not in self._shown and exp.state != State.DONE and "pr" in published:
            if self._closed_while_away(exp, int(published["pr"])):
                return
        if int(published.get("round", "0")) < exp.reopened:  # measured again: a new round of checks and comments
            if "pr" in published and exp.state != State.DONE:
                self._reopen(exp, int(published["pr"]))
            self.store.published.set(exp.id, "final", "")  # first: a crash between the two loses no round
            self.store.published.set(exp.id, "round", str(exp.reopened))
            published = self.store.published.get(exp.id)
        if exp.head_sha is None:  # its branch not pushed (bot.github.branches): no pull request can show it
            if exp.state == State.DONE:  # listed in the research log, with its change
                self.summaries.add(exp)
                self.store.published.set(exp.id, "final", exp.status or "")
            self._shown[exp.id] = shown
            return
        if self.degraded and "pr" not in published and not _promising(exp, runs):
            if exp.state == State.DONE:  # listed in the research log instead (bot.github.summaries)
                self.summaries.add(exp)
                self.store.published.set(exp.id, "final", exp.status or "")
            self._shown[exp.id] = shown
            return
        try:
            number, found = self._pull_request(exp, published, snapshot)
        except _OnMainAlready:  # kept and merged before it was shown: main has it; its check and a log row say so
            if exp.state == State.DONE:
                self._check(exp, published, phase, progress, snapshot)
                self.summaries.add(exp)
                self.store.published.set(exp.id, "final", exp.status or "")
            self._shown[exp.id] = shown
            return
        if found and exp.state != State.DONE and self._closed_while_away(exp, number):
            return  # made by a life that died before noting it, and closed since
        if exp.state != State.DONE:
            self._drop_old_label(exp, number, published)
        if phase == "completed" or self._shows_progress(snapshot):
            self._check(exp, published, phase, progress, snapshot)
        if exp.state == State.DONE:
            self._decision(exp, number, published, snapshot)
            self._label_and_close(exp, number, published)
            self.store.published.set(exp.id, "final", exp.status or "")
        if phase == "in_progress" and progress:
            self._progress_at[exp.id] = self.clock()
        self._shown[exp.id] = shown

    def _shows_progress(self, snapshot: Snapshot) -> bool:
        """Whether an experiment in flight has a check (or commit status) saying so: a long run's, while
        the budget is full and has room (see the module docstring)."""
        if (snapshot.budget_s or 0.0) <= self.short_run_s or self.degraded:
            return False
        return self.budget is None or self.budget.room() >= PROGRESS_ROOM

    def _bot_login(self) -> str | None:
        """The login the bot's own content carries (written by bot.app.serve when it connects)."""
        return self.store.state.bot_login

    def _ours(self, user: Any) -> bool:
        """Whether a PyGithub NamedUser (an author) is the bot itself: only its own pull requests and
        comments may hold the markers the publisher looks for."""
        return render.authored_by(getattr(user, "login", None), self._bot_login())

    # --- GitHub's REST API at a number the store keeps (no read of the object first) --------------------
    def _api(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.repo.requester.requestJsonAndCheck(method, f"{self.repo.url}{path}", **kwargs)[1]

    def _attempt(self, exp: Experiment, key: str, published: dict[str, str]) -> bool:
        """Note that `key` is about to be created; True when an earlier attempt may have created it
        (noted, never finished): then, and only then, the caller looks for it before creating."""
        tried = bool(published.get(f"attempt:{key}"))
        if not tried:
            self.store.published.set(exp.id, f"attempt:{key}", "1")
            published[f"attempt:{key}"] = "1"
        return tried

    # --- the pull request ----------------------------------------------------------------------------
    def _pull_request(self, exp: Experiment, published: dict[str, str], snapshot: Snapshot) -> tuple[int, bool]:
        """The experiment's pull request, and whether it was found by its branch (an earlier attempt
        made it, its answer lost) rather than known or made now."""
        if "pr" in published:
            return int(published["pr"]), False
        existing = []
        if self._attempt(exp, "pr", published):
            existing = [
                p
                for p in self.repo.get_pulls(state="all", head=f"{self.repo.owner.login}:{exp.branch}")
                if self._ours(p.user)
            ]
        if existing:
            number = existing[0].number
        else:
            history = [e for e in self.store.experiments.in_state(State.DONE) if e.id != exp.id][-5:]
            body = render.pr_body(
                exp,
                main_sha=exp.base_sha,
                main_val_bpb=snapshot.main_val_bpb,
                base_asset=self._base_text(exp),
                history=history,
                task=self.task,
            )
            self.pace_write("pull")
            try:
                number = self.repo.create_pull(
                    base=self.main_branch, head=exp.branch or "", title=render.pr_title(exp), body=body
                ).number
            except GithubException as error:
                if error.status == 422 and "No commits between" in str(error.data):
                    raise _OnMainAlready(exp.branch or "") from error
                raise
            failpoint("pull_request_created")  # the crash tests: created on GitHub, not yet in the store
            log.info("experiment %s: opened pull request #%s", exp.id, number)
        self.store.published.set(exp.id, "pr", str(number))
        published["pr"] = str(number)
        if self.on_pull_request is not None:
            self.on_pull_request()
        return number, bool(existing)

    def _reopen(self, exp: Experiment, number: int) -> None:
        """A finished experiment measured again (/rerun, Keep anyway) gets its pull request back open."""
        pull = self.repo.get_pull(number)
        if pull.state == "closed" and not pull.merged:
            self.pace_write("reopen")
            pull.edit(state="open")
            log.info("experiment %s: reopened pull request #%s", exp.id, number)

    def _closed_while_away(self, exp: Experiment, number: int) -> bool:
        """Reconcile after a start: a pull request closed while the bot was not listening (a webhook
        GitHub could not deliver) becomes the pull_request.closed event the webhook would have been,
        stored in the inbox (key: the pull request and when it was closed), so the same handler
        decides whether its closer may cancel the experiment. True when it was stored just now: the
        experiment is shown once the handler has had its say."""
        pull = self.repo.get_pull(number)
        if pull.state != "closed" or pull.merged or exp.request:
            return False
        closer = pull.as_issue().closed_by
        closed_at = pull.closed_at.isoformat() if pull.closed_at else "unknown"
        event = GitHubEvent(
            delivery=f"reconcile-pr-{number}-closed-{closed_at}",
            event="pull_request",
            action="closed",
            kind="pr_closed",
            repository=self.repo.full_name,
            sender=closer.login if closer else None,
            sender_type=closer.type if closer else None,
            association=None,
            number=number,
            branch=pull.head.ref,
            head_sha=pull.head.sha,
            ref=None,
            before=None,
            after=None,
            head_repository=pull.head.repo.full_name if pull.head.repo else None,
        )
        if not self.store.inbox.add(
            key=f"github:{event.delivery}", kind="github", payload=event.to_payload(), author=event.sender or "github"
        ):
            return False  # stored before: the handler has its verdict (a closer without write access cancels nothing)
        log.info("experiment %s: its pull request #%s was closed while the bot was away", exp.id, number)
        return True

    def _base_text(self, exp: Experiment) -> str:
        """The task's asset on the experiment's main ("" when main has none)."""
        try:
            return self.read_file(exp.base_sha, self.task.asset)
        except FileNotFoundError:
            return ""

    def _drop_old_label(self, exp: Experiment, number: int, published: dict[str, str]) -> None:
        """An experiment measured again (reopened, /rerun) loses the verdict label it had (one
        DELETE; 404: a person removed it already). So does an experiment that an older version of
        the bot labelled `autoresearch: running`. A new experiment has none: nothing is sent."""
        if not published.get("label"):
            return
        self.pace_write("label")
        try:
            self._api("DELETE", f"/issues/{number}/labels/{quote(published['label'], safe='')}")
        except GithubException as error:
            if error.status != 404:
                raise
        self.store.published.set(exp.id, "label", "")
        published["label"] = ""

    def _label_and_close(self, exp: Experiment, number: int, published: dict[str, str]) -> None:
        """The verdict: one GET of the issue (its labels, its state), then one PATCH setting the labels
        (the verdict instead of any other autoresearch label, people's labels kept) and closing the
        pull request unless it is closed already (kept: merged by the fast-forward of main)."""
        wanted = render.label(exp.status or "failed", self.task)
        if published.get("label") == wanted.name:
            return
        self._ensure_label(wanted)
        issue = self._api("GET", f"/issues/{number}")
        had = [label["name"] for label in issue.get("labels") or []]
        labels = [name for name in had if not name.startswith("autoresearch: ")] + [wanted.name]
        fields: dict[str, Any] = {"labels": labels} if sorted(labels) != sorted(had) else {}
        if issue.get("state") == "open":
            fields["state"] = "closed"
        if fields:
            self.pace_write("close")
            self._api("PATCH", f"/issues/{number}", input=fields)
        if "state" in fields:
            log.info("experiment %s: closed pull request #%s (%s)", exp.id, number, exp.status)
        self.store.published.set(exp.id, "label", wanted.name)

    def _ensure_label(self, label: render.Label) -> None:
        if label.name in self._labels_ready:
            return
        try:
            self.repo.get_label(label.name)
        except GithubException as error:
            if error.status != 404:
                raise
            self.pace_write("label")
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
        runs = self.store.runs.all(experiment_id=exp.id)
        body = render.decision_comment(
            exp, main_val_bpb=exp.meta.get("main_val_bpb", snapshot.main_val_bpb), runs=runs, metric=self.task.metric
        )
        wanted = render.find_marker(body)
        found = None
        if self._attempt(exp, key, published):
            found = next(
                (
                    c.id
                    for c in self.repo.get_issue(number).get_comments()
                    if self._ours(c.user) and render.find_marker(c.body) == wanted
                ),
                None,
            )
        if found is None:
            self.pace_write("comment")
            found = self._api("POST", f"/issues/{number}/comments", input={"body": body})["id"]
            failpoint("comment_posted")
        self.store.published.set(exp.id, key, str(found))

    # --- the metric's check ------------------------------------------------------------------------------
    def _check(
        self,
        exp: Experiment,
        published: dict[str, str],
        phase: str,
        progress: dict[str, Any] | None,
        snapshot: Snapshot,
    ) -> None:
        head = exp.head_sha or ""
        status = exp.status if phase == "completed" else phase
        title = render.check_title(exp, status=status or "failed", progress=progress, metric=self.task.metric)
        if phase == "completed":
            runs = self.store.runs.all(experiment_id=exp.id)
            summary = render.check_summary(
                exp,
                runs,
                main_val_bpb=exp.meta.get("main_val_bpb", snapshot.main_val_bpb),
                noise_margin=exp.margin,
                metric=self.task.metric,
            )
            tails = [r.log_tail for r in runs if r.log_tail]
            text = render.check_text(tails[-1] if tails else exp.error_tail or "")
        else:
            summary = render.progress_summary(progress, snapshot.budget_s) if progress else title
            text = ""
        if not self.uses_app:
            self._status(exp, published, head, status or "failed")
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
        external_id = f"autoresearch:{exp.id}:{round_}"
        if key not in published:
            found = self._find_check(head, external_id) if self._attempt(exp, key, published) else None
            if found is None:  # created with what it shows now: nothing to update after
                self.pace_write("check")
                check = self._api(
                    "POST",
                    "/check-runs",
                    input={"name": self.check_name, "head_sha": head, "external_id": external_id, **fields},
                )
                failpoint("check_run_created")
                log.info("experiment %s: check run %s on %s (%s)", exp.id, check["id"], head[:7], phase)
                self.store.published.set(exp.id, key, str(check["id"]))
                published[key] = str(check["id"])
                if phase == "completed":
                    self.store.published.set(exp.id, key + ":done", "1")
                return
            self.store.published.set(exp.id, key, str(found))
            published[key] = str(found)
        self.pace_write("check")
        self._api("PATCH", f"/check-runs/{published[key]}", input=fields)
        if phase == "completed":
            self.store.published.set(exp.id, key + ":done", "1")

    def _find_check(self, head: str, external_id: str) -> int | None:
        """The id of the check run an earlier attempt may have created (one GET, by its external_id)."""
        answer = self._api(
            "GET",
            f"/commits/{head}/check-runs",
            parameters={"check_name": self.check_name, "filter": "all", "per_page": 100},
        )
        return next(
            (
                c["id"]
                for c in answer.get("check_runs") or []
                if c.get("external_id") == external_id
                and render.authored_by(f"{(c.get('app') or {}).get('slug')}[bot]", self._bot_login())
            ),
            None,
        )

    def _supersede(self, exp: Experiment, key: str, published: dict[str, str]) -> None:
        """A check on a commit the experiment left (rebased onto a newer main) ends as neutral
        (one PATCH: the bot's check runs are completed by the bot only, so no read first)."""
        if published.get(key + ":done"):
            return
        self.pace_write("check")
        self._api(
            "PATCH",
            f"/check-runs/{published[key]}",
            input={
                "status": "completed",
                "conclusion": "neutral",
                "output": {
                    "title": "superseded: rebased onto a newer main and measured again",
                    "summary": f"Experiment {exp.id} now lives on {exp.head_sha}.",
                },
            },
        )
        self.store.published.set(exp.id, key + ":done", "1")
        published[key + ":done"] = "1"

    def _status(self, exp: Experiment, published: dict[str, str], head: str, status: str) -> None:
        """The fallback without an App: a commit status (latest per context wins, so it is idempotent),
        posted only when it differs from the last one posted on this commit (progress does not show
        in a status, so a run in progress posts none)."""
        fields = {
            "state": STATUS_STATE.get(status, "error"),
            "description": render.status_description(exp, status=status, metric=self.task.metric),
            "context": self.check_name,
        }
        key, shown = f"status:{head}", f"{fields['state']} {fields['description']}"
        if published.get(key) == shown:
            return
        self.pace_write("status")
        self._api("POST", f"/statuses/{head}", input=fields)
        self.store.published.set(exp.id, key, shown)
        published[key] = shown


class _OnMainAlready(Exception):
    """GitHub refuses a pull request for a branch main already holds: a kept experiment merged before
    its pull request was opened (publishing runs behind the conductor, on its own thread)."""


def pull_request_first(store: Store, budget: WriteBudget | None) -> Callable[[Experiment], str | None]:
    """The lifecycle's merge gate in full mode: a keep waits until its pull request is open, since
    GitHub refuses one for a branch main already holds. None (go) once it is, and always in degraded
    mode, where most keeps have none yet, or while the write budget has no room for one now: the
    research never waits on the write limits. The publisher opens a waiting keep's pull request
    first in its pass. `store` is the conductor's connection: the gate is asked on its thread."""

    def holds(exp: Experiment) -> str | None:
        if budget is not None and (budget.mode.mode == "degraded" or budget.room() < 1):
            return None  # the pull request would wait for room itself: main does not wait for it
        published = store.published.get(exp.id)
        if "pr" not in published:
            return "its pull request is not open yet"
        if int(published.get("round", "0")) < exp.reopened:  # measured again: its pull request is reopened first
            return "its pull request is not open again yet"
        return None

    return holds


def _promising(exp: Experiment, runs: list[Any]) -> bool:
    """Kept, being merged, or asked by the judge to confirm: shown on a pull request in any mode."""
    return exp.status == Status.KEEP or exp.state == State.MERGING or any(r.purpose == "confirm" for r in runs)
