"""What each GitHub event does, applied from the inbox by the conductor (exactly once per delivery).

The web server (bot.app.web) and the poller (bot.github.poller) store each event as an inbox entry of
kind `github` whose payload is a bot.github.webhooks.GitHubEvent. This module turns it into store
writes: a person's request on an experiment (bot.core.states.Request), feedback for the agent, a
pause, or a reply to queue (on the pull request or plain issue the command was written in). The
conductor acts on requests at its next tick; the publisher posts replies. Nothing here writes to
GitHub or calls a runner; the one thing it asks GitHub is who may steer (bot.github.permissions),
through the lookup bot.app.serve gives it.

`GitHubEvents.router()` is the inbox router (bot.core.router) of the `github` kind, which
bot.app.serve joins with the loop's own; inside it, each kind of GitHubEvent has its action on
`actions`. `/pause` and `/resume` are the loop's own pause and resume, applied through the loop's
router the app gives (`loop`), so they are written once.

Boundaries, checked here so the webhook and the poller paths give the same verdicts:
- The research repository only. An App installation can cover other repositories, and their
  deliveries are signed like the research repository's: a delivery about another repository (its
  `repository.full_name`, compared without case) is logged and processed as "not the research
  repository", with no effect. Installation events name no repository and are only logged.
- Experiments by the pull request the bot opened. An event names an experiment only by the number
  of the pull request the publisher recorded for it (store.published.experiment_of_pull); an event about a
  pull request must also have its head on the research repository, at the experiment's branch (a
  fork's pull request has its own head repository, whatever its branch is called). A check run's
  event names an experiment only by the id of a check run the publisher created
  (store.published.experiment_of_check_run): `check_run.pull_requests` is empty for forks, and another App
  can create check runs with any name and external_id.
- Only people with write access steer (admin, maintain or write; asked of GitHub, see
  bot.github.permissions): comments, reviews and commands (feedback reaches the agent only from an
  experiment's pull request), closing and reopening an experiment's pull request, and a check run's
  Re-run and buttons (GitHub lets any App with checks:read re-request a check run, and does not
  document who may press its buttons, so they are checked like a command). A comment's author
  association rules out NONE, CONTRIBUTOR, FIRST_TIME_CONTRIBUTOR, ... without asking; an App
  (sender type Bot) never steers; the bot's own comments and the pull requests it closes itself are
  ignored by login. Anyone else's event is logged and dropped: it never reaches the agent, starts
  no run and gets no reply.
- When GitHub cannot say whether someone may steer, the entry waits in the inbox (bot.core.router.Deferred)
  and is asked about again at the next tick; after WAIT_FOR_GITHUB_S of waiting it is dropped with
  an outcome that says so, so nothing waits forever.
- Text people wrote (a comment, a /try idea) loses its control and bidirectional formatting
  characters (bot.views.text.plain) before it is stored or repeated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bot.core.router import Deferred, RejectedInput, Router
from bot.core.states import Request, State, Status
from bot.github import render
from bot.github.permissions import Permissions, PermissionUnknown, quick_no
from bot.github.webhooks import GitHubEvent
from bot.store import Experiment, InboxEntry, Store
from bot.views.text import plain

log = logging.getLogger(__name__)

BRANCH_PREFIX = "autoresearch/"
ACTION_REQUEST = {"rerun": Request.RERUN, "keep": Request.KEEP, "discard": Request.DISCARD}
WAIT_FOR_GITHUB_S = 600.0  # how long an entry waits for GitHub to say whether its sender may steer
NOT_OURS = "not the research repository"


@dataclass
class Context:
    """One event being applied: the store, the event (its text made plain), and the rules."""

    store: Store
    event: GitHubEvent
    entry: InboxEntry
    rules: GitHubEvents

    def is_bot(self) -> bool:
        login = self.store.state.bot_login
        return bool(login) and (self.event.sender or "").lower() == (login or "").lower()

    def refused(self, *, what: str, asking_again: bool = False) -> str | None:
        """Why the sender may not `what` (an outcome), or None when they may. `asking_again` (a
        command, a button) asks GitHub again over a remembered "no" (bot.github.permissions says
        how old it must be). Raises Deferred while GitHub cannot say (see GitHubEvents.wait)."""
        event, who = self.event, self.event.sender
        if who is None:
            return f"ignored: GitHub does not say who did it, so it cannot {what}"
        if event.sender_type == "Bot":
            return f"ignored: {who} is an app, and only people with write access may {what}"
        if event.kind in ("feedback", "command") and quick_no(event.association):
            return f"ignored: {who} ({event.association}) has no write access"
        if self.rules.permissions is None:
            return self.rules.wait(self.entry, "the service has not connected to GitHub yet")
        try:
            access = self.rules.permissions.access(who, fresh=asking_again)
        except PermissionUnknown as error:
            return self.rules.wait(self.entry, str(error))
        self.rules.waited(self.entry)
        if not access.may_steer:
            return f"ignored: {who} has the {access.role} role, no write access, so cannot {what}"
        return None

    def loop_input(self, kind: str) -> str:
        """Apply the loop's own input `kind` (pause, resume) as part of this event; its outcome."""
        handler = self.rules.loop.handler(kind)
        if handler is None:
            raise RejectedInput(f"the loop takes no {kind!r} input")
        return handler(self.store, self.entry)

    def experiment(self) -> Experiment | None:
        """The experiment whose pull request the event is about (see the module docstring)."""
        event = self.event
        if event.number is None:
            return None
        exp = self.store.published.experiment_of_pull(event.number)
        if exp is None:
            return None
        if event.branch is not None and (not self.rules.ours(event.head_repository) or event.branch != exp.branch):
            return None  # a pull request event whose head is elsewhere: a fork's, whatever its branch is called
        return exp


Action = Callable[[Context], str]
actions: Router[Action] = Router()  # GitHubEvent.kind -> what it does
InboxHandler = Callable[[Store, InboxEntry], str]


@dataclass
class GitHubEvents:
    """The inbox handler of kind `github` for one research repository (`owner/name`), asking
    `permissions` who may steer; `loop` is the loop's own router, whose pause and resume the
    commands apply. Unwired (None), every event waits, as if GitHub could not say."""

    repository: str | None = None
    permissions: Permissions | None = None
    clock: Callable[[], float] = time.monotonic
    wait_for_github_s: float = WAIT_FOR_GITHUB_S
    loop: Router[InboxHandler] = field(kw_only=True)
    _waiting: dict[int, float] = field(default_factory=dict)  # inbox entry id -> when it first waited

    def router(self) -> Router[InboxHandler]:
        """The inbox router of `github` entries, applied by this handler (bot.app.serve joins it)."""
        router: Router[InboxHandler] = Router()
        router.on("github")(self)
        return router

    def ours(self, repository: str | None) -> bool:
        return repository is not None and self.repository is not None and repository.lower() == self.repository.lower()

    def wait(self, entry: InboxEntry, why: str) -> str:
        """Defer `entry` to the next tick (raises Deferred), or, once it has waited
        `wait_for_github_s`, the outcome that drops it."""
        now = self.clock()
        since = self._waiting.setdefault(entry.id, now)
        if now - since < self.wait_for_github_s:
            raise Deferred(f"{why}; asking again at the next tick")
        self._waiting.pop(entry.id, None)
        return (
            f"dropped after waiting {(now - since) / 60:.0f} min for GitHub to say whether {entry.author} "
            f"may steer ({why}): write it again once GitHub answers"
        )

    def waited(self, entry: InboxEntry) -> None:
        self._waiting.pop(entry.id, None)

    def __call__(self, store: Store, entry: InboxEntry) -> str:
        try:
            event = GitHubEvent.from_payload(entry.payload)
        except ValueError as error:
            raise RejectedInput(f"not a GitHub event: {error}") from error
        event = replace(event, body=plain(event.body), argument=plain(event.argument))
        action = actions.handler(event.kind)
        if action is None:
            return f"{event.event}.{event.action or ''}: nothing to do"
        if event.repository is not None and not self.ours(event.repository):
            if self.repository is None:
                return self.wait(entry, "the service has not connected to GitHub yet")
            log.info(
                "github %s.%s (%s) from %s is about %s, %s: acknowledged, ignored",
                event.event,
                event.action or "",
                event.delivery,
                event.sender,
                event.repository,
                NOT_OURS,
            )
            return f"{NOT_OURS} ({event.repository}): ignored"
        outcome = action(Context(store, event, entry, self))
        log.info(
            "github %s.%s (%s) from %s: %s", event.event, event.action or "", event.delivery, event.sender, outcome
        )
        return outcome


@actions.on("push")
def push(ctx: Context) -> str:
    # The conductor reads main at every tick: a new program.md is used by the next proposal, a new
    # train.py gets a new baseline. The delivery only wakes it.
    return f"{ctx.event.ref} moved to {(ctx.event.after or '')[:7]}; read at the next tick"


@actions.on("pr_closed")
def pr_closed(ctx: Context) -> str:
    event, store = ctx.event, ctx.store
    exp = ctx.experiment()
    if exp is None:
        return "not an experiment's pull request"
    if event.merged or ctx.is_bot():
        return "closed by the bot itself"
    if exp.state == State.DONE:
        return f"experiment {exp.id} had already ended ({exp.status})"
    if (refused := ctx.refused(what="cancel an experiment")) is not None:
        return refused
    store.experiments.request(exp.id, Request.CANCEL, event.sender or "someone")
    return f"experiment {exp.id} will be cancelled"


@actions.on("pr_reopened")
def pr_reopened(ctx: Context) -> str:
    event, store = ctx.event, ctx.store
    exp = ctx.experiment()
    if exp is None or ctx.is_bot():
        return "nothing to do"
    if exp.state != State.DONE or exp.status == Status.KEEP:
        return f"experiment {exp.id} is {exp.status or exp.state}: nothing to reopen"
    if (refused := ctx.refused(what="measure an experiment again")) is not None:
        return refused
    store.experiments.request(exp.id, Request.REOPEN, event.sender or "someone")
    return f"experiment {exp.id} will be measured again"


@actions.on("feedback")
def feedback(ctx: Context) -> str:
    event = ctx.event
    if ctx.is_bot():
        return "the bot's own comment"
    if ctx.experiment() is None:
        return "not an experiment's pull request: not feedback for the agent"
    if (refused := ctx.refused(what="steer the agent")) is not None:
        return refused
    ctx.store.feedback.add(event.sender or "someone", f"{event.sender} on #{event.number}: {event.body.strip()}")
    return "the agent will read it"


@actions.on("command")
def command(ctx: Context) -> str:
    event, store = ctx.event, ctx.store
    if ctx.is_bot():
        return "the bot's own comment"
    name, argument, who = event.command or "", event.argument, event.sender or "someone"
    if (refused := ctx.refused(what=f"/{name}", asking_again=True)) is not None:
        return refused
    outcome = _command(ctx, name, argument, who)
    # the reply goes where the comment is: a pull request, or a plain issue (`/pause` in a tracking
    # issue), whose number is not `number` (that names pull requests only, so `/keep` finds nothing
    # there). An entry stored before issue_number existed has it None: its pull request, if any.
    where = event.issue_number if event.issue_number is not None else event.number
    if event.event == "issue_comment" and event.comment_id is not None and where is not None:
        # a review's id is not a comment's: reviews get no reaction and no reply
        store.replies.add(event.comment_id, where, render.ack_comment(name, argument, outcome, event.comment_id))
    return outcome


def _command(ctx: Context, name: str, argument: str, who: str) -> str:
    store = ctx.store
    if name in ("pause", "resume"):  # the loop's own inputs, as `autoresearch pause` and `resume` give them
        outcome = ctx.loop_input(name)
        return f"{outcome} until /resume" if name == "pause" else outcome
    if name == "try":
        store.feedback.add(who, f"{who} asks to try next: {argument}")
        return f"the agent will be asked to try: {argument}"
    exp = ctx.experiment()
    if exp is None:
        return f"/{name} works on an experiment's pull request"
    return _request(store, exp, ACTION_REQUEST[name], who)


def _request(store: Store, exp: Experiment, request: Request, who: str) -> str:
    if exp.state == State.DONE and exp.status == Status.KEEP:
        return f"experiment {exp.id} is already kept"
    if request == Request.DISCARD and exp.state == State.DONE:
        return f"experiment {exp.id} already ended ({exp.status})"
    store.experiments.request(exp.id, request, who)
    return {
        Request.RERUN: f"experiment {exp.id} will be measured once more",
        Request.KEEP: f"experiment {exp.id} will be merged once measured on the current main",
        Request.DISCARD: f"experiment {exp.id} will be stopped and closed",
    }[request]


@actions.on("check_rerun")
def check_rerun(ctx: Context) -> str:
    return _check_button(ctx, "rerun")


@actions.on("check_action")
def check_action(ctx: Context) -> str:
    if ctx.event.requested_action not in ACTION_REQUEST:
        return f"unknown button {ctx.event.requested_action!r}"
    return _check_button(ctx, ctx.event.requested_action)


def _check_button(ctx: Context, name: str) -> str:
    # GitHub lets any App with checks:read re-request a check run, and its documentation does not
    # say who may press a check run's buttons: the sender is checked like a command's author.
    event = ctx.event
    exp = ctx.store.published.experiment_of_check_run(event.check_run_id) if event.check_run_id is not None else None
    if exp is None:
        return "not an autoresearch check run"
    if ctx.is_bot():
        return "the bot's own request"
    if (refused := ctx.refused(what=f"press {name}", asking_again=True)) is not None:
        return refused
    return _request(ctx.store, exp, ACTION_REQUEST[name], event.sender or "someone")


@actions.on("installation")
def installation(ctx: Context) -> str:
    # no effect: the bot acts on its one repository, through the installation it was configured with
    return f"installation {ctx.event.installation_id} {ctx.event.action}"
