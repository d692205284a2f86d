"""What each GitHub event does, applied from the inbox by the conductor (exactly once per delivery).

The web server (bot.web) and the poller (bot.github.poller) store each event as an inbox entry of
kind `github` whose payload is a bot.github.webhooks.GitHubEvent. This module turns it into store
writes: a person's request on an experiment (bot.states.Request), feedback for the agent, a
pause, or a reply to queue. The conductor acts on requests at its next tick; the publisher posts
replies. Nothing here calls GitHub or a runner.

Trust: only people with write access steer. GitHub says so in the event itself (the author
association OWNER, MEMBER or COLLABORATOR); anyone else's comment, review or command is logged and
dropped, so it never reaches the agent and never starts a run. The bot's own comments and the
pull requests it closes itself are ignored by login.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from bot.events import RejectedInput, on
from bot.github import render
from bot.github.webhooks import GitHubEvent
from bot.states import Request, State, Status
from bot.store import Experiment, InboxEntry, Store

log = logging.getLogger(__name__)

TRUSTED = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})
BOT_LOGIN = "github.bot_login"  # store setting: the bot's own login, written when the service starts
BRANCH_PREFIX = "autoresearch/"
ACTION_REQUEST = {"rerun": Request.RERUN, "keep": Request.KEEP, "discard": Request.DISCARD}

Action = Callable[[Store, GitHubEvent], str]
ACTIONS: dict[str, Action] = {}


def when(kind: str) -> Callable[[Action], Action]:
    def register(action: Action) -> Action:
        ACTIONS[kind] = action
        return action
    return register


@on("github")
def github_event(store: Store, entry: InboxEntry) -> str:
    try:
        event = GitHubEvent.from_payload(entry.payload)
    except ValueError as error:
        raise RejectedInput(f"not a GitHub event: {error}") from error
    action = ACTIONS.get(event.kind)
    if action is None:
        return f"{event.event}.{event.action or ''}: nothing to do"
    outcome = action(store, event)
    log.info("github %s.%s (%s) from %s: %s", event.event, event.action or "", event.delivery, event.sender, outcome)
    return outcome


def _is_bot(store: Store, event: GitHubEvent) -> bool:
    login = store.get_setting(BOT_LOGIN)
    return bool(login) and event.sender == login


def _trusted(event: GitHubEvent) -> bool:
    return (event.association or "").upper() in TRUSTED and event.sender_type != "Bot"


def _experiment(store: Store, event: GitHubEvent) -> Experiment | None:
    if event.branch and event.branch.startswith(BRANCH_PREFIX):
        return store.experiment_by_branch(event.branch)
    if event.number is not None:  # an issue comment names the pull request by number only
        return store.experiment_by_pull(event.number)
    return None


@when("push")
def push(store: Store, event: GitHubEvent) -> str:
    # The conductor reads main at every tick: a new program.md is used by the next proposal, a new
    # train.py gets a new baseline. The delivery only wakes it.
    return f"{event.ref} moved to {(event.after or '')[:7]}; read at the next tick"


@when("pr_closed")
def pr_closed(store: Store, event: GitHubEvent) -> str:
    exp = _experiment(store, event)
    if exp is None:
        return "not an experiment's pull request"
    if event.merged or _is_bot(store, event):
        return "closed by the bot itself"
    if exp.state == State.DONE:
        return f"experiment {exp.id} had already ended ({exp.status})"
    store.request(exp.id, Request.CANCEL, event.sender or "someone")
    return f"experiment {exp.id} will be cancelled"


@when("pr_reopened")
def pr_reopened(store: Store, event: GitHubEvent) -> str:
    exp = _experiment(store, event)
    if exp is None or _is_bot(store, event):
        return "nothing to do"
    if exp.state != State.DONE or exp.status == Status.KEEP:
        return f"experiment {exp.id} is {exp.status or exp.state}: nothing to reopen"
    store.request(exp.id, Request.REOPEN, event.sender or "someone")
    return f"experiment {exp.id} will be measured again"


def _not_heard(store: Store, event: GitHubEvent) -> str | None:
    """Why a comment or command is dropped (the bot's own, or from someone without write access)."""
    if _is_bot(store, event):
        return "the bot's own comment"
    if not _trusted(event):
        return f"ignored: {event.sender} ({event.association}) has no write access"
    return None


@when("feedback")
def feedback(store: Store, event: GitHubEvent) -> str:
    if (dropped := _not_heard(store, event)) is not None:
        return dropped
    where = f" on #{event.number}" if event.number else ""
    store.add_feedback(event.sender or "someone", f"{event.sender}{where}: {event.body.strip()}")
    return "the agent will read it"


@when("command")
def command(store: Store, event: GitHubEvent) -> str:
    if (dropped := _not_heard(store, event)) is not None:
        return dropped
    name, argument, who = event.command or "", event.argument, event.sender or "someone"
    outcome = _command(store, event, name, argument, who)
    if event.event == "issue_comment" and event.comment_id is not None and event.number is not None:
        # a review's id is not a comment's: reviews get no reaction and no reply
        store.add_reply(event.comment_id, event.number, render.ack_comment(name, argument, outcome, event.comment_id))
    return outcome


def _command(store: Store, event: GitHubEvent, name: str, argument: str, who: str) -> str:
    if name == "pause":
        store.set_setting("paused", "1")
        return "paused: running experiments finish, nothing new is proposed until /resume"
    if name == "resume":
        store.set_setting("paused", "0")
        return "resumed"
    if name == "try":
        store.add_feedback(who, f"{who} asks to try next: {argument}")
        return f"the agent will be asked to try: {argument}"
    exp = _experiment(store, event)
    if exp is None:
        return f"/{name} works on an experiment's pull request"
    return _request(store, exp, ACTION_REQUEST[name], who)


def _request(store: Store, exp: Experiment, request: Request, who: str) -> str:
    if exp.state == State.DONE and exp.status == Status.KEEP:
        return f"experiment {exp.id} is already kept"
    if request == Request.DISCARD and exp.state == State.DONE:
        return f"experiment {exp.id} already ended ({exp.status})"
    store.request(exp.id, request, who)
    return {Request.RERUN: f"experiment {exp.id} will be measured once more",
            Request.KEEP: f"experiment {exp.id} will be merged once measured on the current main",
            Request.DISCARD: f"experiment {exp.id} will be stopped and closed"}[request]


@when("check_rerun")
def check_rerun(store: Store, event: GitHubEvent) -> str:
    return _check_button(store, event, "rerun")


@when("check_action")
def check_action(store: Store, event: GitHubEvent) -> str:
    if event.requested_action not in ACTION_REQUEST:
        return f"unknown button {event.requested_action!r}"
    return _check_button(store, event, event.requested_action)


def _check_button(store: Store, event: GitHubEvent, name: str) -> str:
    # Only people who can write to the repository can press a check's buttons; GitHub enforces it.
    exp_id = _experiment_of_check(event.external_id)
    if exp_id is None:
        return "not an autoresearch check run"
    try:
        exp = store.experiment(exp_id)
    except KeyError:
        return f"no experiment {exp_id}"
    return _request(store, exp, ACTION_REQUEST[name], event.sender or "someone")


def _experiment_of_check(external_id: str | None) -> int | None:
    parts = (external_id or "").split(":")
    if len(parts) >= 2 and parts[0] == "autoresearch" and parts[1].isdigit():
        return int(parts[1])
    return None


@when("installation")
def installation(store: Store, event: GitHubEvent) -> str:
    return f"installation {event.installation_id} {event.action}"
