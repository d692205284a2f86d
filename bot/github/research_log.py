"""The research log: one issue per repository whose body the bot keeps as a summary of the research
so far (best val_bpb and its gain over the first baseline, the kept changes in order, counts, pace,
agent spend, what is running), edited in place, never commented on, so watching it costs nobody a
notification per experiment.

Level-triggered like the publisher: each update renders the summary from the store and writes only
when the text differs from what was last written (its digest, kept with the issue's number in the
store setting `github.research_log`). The "Updated ..." line at its end is left out of the digest,
or every tick would differ. Writes are paced: at most one edit every `every_s` seconds, unless a
change was kept since (the news the log exists for: a new best, a new row), so neither a busy run
nor a stream of discarded and crashed experiments edits the issue at every tick: their counts wait
at most `every_s`. So the log costs at most 3600 / every_s edits an hour (12 at 300 s) plus one per
kept change, however many experiments finish.

The issue is found again before it is ever created (its idempotency key is the hidden marker
`<!-- autoresearch:log:0 -->` under the label `autoresearch: log`): by the number in the store,
else by one request listing the open and closed issues with that label (only one the bot itself
opened counts: anyone can quote the marker, and a triager can label). So neither a lost answer
to the create (a 502 after GitHub made the issue) nor a lost store makes a second one. A person
who closes the issue is respected: its body is kept up to date, it is never reopened.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from github import GithubException
from github.Repository import Repository

from bot.github import render
from bot.github.handlers import BOT_LOGIN
from bot.github.render import _bpb, _cell, _limit, _one_line, _plural, _signed  # the formatting PR bodies use
from bot.store import Store
from bot.views import results

__all__ = ["LABEL", "TITLE", "Facts", "Kept", "ResearchLog", "Running", "content_digest", "facts", "log_body"]

log = logging.getLogger(__name__)

TITLE = "autoresearch: research log"
LABEL = render.Label("autoresearch: log", "1d76db", "The research log: one issue the bot keeps up to date")
SETTING = "github.research_log"  # {"number", "digest", "edited_at", "kept"}
MARKER = render.marker("log", 0)
BODY_LIMIT = render.PR_BODY_LIMIT  # an issue body's limit too: 65,536 characters
DAY_S = 24 * 3600
RUNNING_SHOWN = 20
INTRO = ("The bot edits this summary in place as the research goes on; each experiment is a pull request. "
         "Closing this issue does not stop the bot: it keeps the summary current.")
_UPDATED = "\n\n---\n*Updated "  # starts the one line left out of the digest
_OUTCOMES = [("keep", "kept"), ("discard", "discarded"), ("crash", "crashed"), ("failed", "failed"),
             ("cancelled", "cancelled")]


# --- what the log says, read from the store -------------------------------------------------------

@dataclass(frozen=True)
class Kept:
    id: int
    title: str
    val_bpb: float | None
    delta: float | None  # vs main at the decision
    remeasured_delta: float | None  # the new main's fresh baseline minus the old main's
    pull: int | None


@dataclass(frozen=True)
class Running:
    run_id: int
    purpose: str
    experiment_id: int | None  # None: a run of main itself (a baseline)
    title: str
    pull: int | None
    started_at: float | None


@dataclass(frozen=True)
class Facts:
    baseline: float | None  # the first main's val_bpb
    kept: list[Kept]  # in experiment order
    finished: dict[str, int]  # finished experiments per status
    in_progress: int
    finished_last_day: int
    spent_usd: float
    running: list[Running]
    queued: int  # runs waiting for a runner


def _pull(store: Store, exp_id: int) -> int | None:
    number = store.published(exp_id).get("pr")
    return int(number) if number else None


def facts(store: Store, now: float) -> Facts:
    """Everything the log shows, from the store (no GitHub call). `now` is on the store's clock
    (time.time): experiments count as finished in the last 24 h by their last update."""
    done = store.experiments(active=False)
    kept = [Kept(e.id, e.title, e.val_bpb, e.delta, e.remeasured_delta, _pull(store, e.id))
            for e in done if e.status == "keep"]
    titles: dict[int, str] = {}
    running: list[Running] = []
    for run in store.runs(state="running"):
        if run.experiment_id is not None and run.experiment_id not in titles:
            titles[run.experiment_id] = store.experiment(run.experiment_id).title
        running.append(Running(run.id, run.purpose, run.experiment_id, titles.get(run.experiment_id, ""),
                               _pull(store, run.experiment_id) if run.experiment_id is not None else None,
                               run.started_at))
    try:
        spent = float(store.get_setting("agent.spent_usd") or 0.0)
    except ValueError:
        spent = 0.0
    return Facts(baseline=results.baseline_val_bpb(store), kept=kept, finished=store.counts_by_status(),
                 in_progress=len(store.experiments(active=True)),
                 finished_last_day=sum(e.updated_at >= now - DAY_S for e in done), spent_usd=spent,
                 running=running, queued=store.count_runs("queued"))


# --- the body, as text ----------------------------------------------------------------------------

def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


def _standing(f: Facts) -> list[str]:
    rows = ["| | |", "| --- | --- |"]
    measured = [k for k in f.kept if k.val_bpb is not None]
    best = min(measured, key=lambda k: k.val_bpb or 0.0, default=None)
    if best is not None and (f.baseline is None or (best.val_bpb or 0.0) < f.baseline):
        where = f"experiment {best.id}" + (f", #{best.pull}" if best.pull else "")
        rows.append(f"| Best val_bpb | **{_bpb(best.val_bpb)}** ({where}) |")
        if f.baseline is not None and best.val_bpb is not None:
            gain = best.val_bpb - f.baseline
            rows.append(f"| Gain over the first baseline | {_signed(gain)} ({100 * gain / f.baseline:+.2f}%) "
                        f"from {_bpb(f.baseline)} |")
    elif f.baseline is not None:
        rows.append(f"| Best val_bpb | **{_bpb(f.baseline)}** (the first baseline) |")
    else:
        rows.append("| Best val_bpb | not measured yet: main's baseline runs have not finished |")
    total = sum(f.finished.values())
    outcomes = [f"{f.finished.get(status, 0)} {word}" for status, word in _OUTCOMES
                if status in ("keep", "discard", "crash") or f.finished.get(status)]
    rows.append(f"| Experiments | {total} finished: {', '.join(outcomes)}; {f.in_progress} in progress |")
    rows.append(f"| Pace | {f.finished_last_day} finished in the last 24 h ({f.finished_last_day / 24:.2f} per hour) |")
    rows.append(f"| Agent spend | ${f.spent_usd:,.2f} |")
    return rows


def _running(f: Facts) -> list[str]:
    lines = []
    for r in f.running[:RUNNING_SHOWN]:
        what = (f"Experiment {r.experiment_id} *{_cell(_one_line(r.title, 100))}*" + (f" (#{r.pull})" if r.pull else "")
                if r.experiment_id is not None else "Main")
        since = f", since {_when(r.started_at)}" if r.started_at else ""
        lines.append(f"- {what}: {r.purpose} run {r.run_id}{since}")
    if len(f.running) > RUNNING_SHOWN:
        lines.append(f"- and {_plural(len(f.running) - RUNNING_SHOWN, 'more run')}")
    if not lines:
        lines.append("Nothing is running.")
    if f.queued:
        lines.append(f"\n{_plural(f.queued, 'run')} queued.")
    return lines


def _kept_row(k: Kept) -> str:
    return (f"| {k.id} | {_cell(_one_line(k.title, 120))} | {_bpb(k.val_bpb)} | {_signed(k.delta)} "
            f"| {_signed(k.remeasured_delta)} | {f'#{k.pull}' if k.pull else '—'} |")


def log_body(f: Facts, now: float) -> str:
    """The issue body: within GitHub's 65,536 characters however many changes were kept (the
    oldest ones are left out first, saying so), with exactly one marker (titles are defanged)."""
    head = "\n".join([
        MARKER, "# Research log", "",
        INTRO, "",
        "## Where it stands", "", *_standing(f), "", "## Running now", "", *_running(f), "",
        "## Kept changes", "", ""])
    tail = f"{_UPDATED}{_when(now)}.*"
    if not f.kept:
        return _limit(f"{head}No change has been kept yet.{tail}", BODY_LIMIT)
    header = ("| Experiment | Change | val_bpb | Δ vs main | Δ re-measured | Pull request |\n"
              "| --- | --- | --- | --- | --- | --- |")
    note_room = 200
    room = BODY_LIMIT - len(f"{head}{header}{tail}".encode()) - note_room
    shown: list[str] = []
    for k in reversed(f.kept):  # the newest first, so the oldest are the ones left out
        row = _kept_row(k)
        if len(row.encode()) + 1 > room:
            break
        shown.append(row)
        room -= len(row.encode()) + 1
    shown.reverse()
    left_out = len(f.kept) - len(shown)
    note = (f"\n\n*The first {_plural(left_out, 'kept change')} are not listed (GitHub shows at most "
            f"{BODY_LIMIT:,} characters here); `autoresearch results` lists them all.*" if left_out else "")
    return _limit(f"{head}{header}\n" + "\n".join(shown) + note + tail, BODY_LIMIT)


def content_digest(body: str) -> str:
    """What identifies a body's content: its text without the "Updated ..." line."""
    return hashlib.sha256(body.split(_UPDATED)[0].encode()).hexdigest()


# --- the issue on GitHub --------------------------------------------------------------------------

class ResearchLog:
    def __init__(self, store: Store, repo: Repository, *, pace_write: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.time, every_s: float = 300.0) -> None:
        self.store = store
        self.repo = repo
        self.pace_write = pace_write
        self.clock = clock
        self.every_s = every_s

    def update(self) -> None:
        """Bring the issue up to date: create it once, else edit its body when the text changed
        (and the last edit is `every_s` old, or a change was kept since); nothing otherwise."""
        saved = self._saved()
        now = self.clock()
        kept = self.store.counts_by_status().get("keep", 0)
        number = saved.get("number")
        if number and saved.get("kept") == kept and now - float(saved.get("edited_at", 0.0)) < self.every_s:
            return  # paced: the next edit waits for a kept change or the end of the interval
        body = log_body(facts(self.store, now), now)
        digest = content_digest(body)
        if number and saved.get("digest") == digest:
            return
        if number and self._edit(int(number), body):
            self._save(int(number), digest, now, kept)
            return
        if number:
            log.info("research log #%s is gone (deleted or moved): looking for it by its marker", number)
        found = self._find()
        if found is None:
            self._create(body, digest, now, kept)
            return
        number, text = found
        if content_digest(text) != digest and not self._edit(number, body):
            raise RuntimeError(f"research log #{number} vanished while it was being edited; it is looked "
                               "for again at the next update")
        self._save(number, digest, now, kept)

    # --- the store ---------------------------------------------------------------------------------
    def _saved(self) -> dict[str, Any]:
        try:
            saved = json.loads(self.store.get_setting(SETTING) or "{}")
        except ValueError:
            return {}
        return saved if isinstance(saved, dict) else {}

    def _save(self, number: int, digest: str, now: float, kept: int) -> None:
        self.store.set_setting(SETTING, json.dumps({"number": number, "digest": digest, "edited_at": now,
                                                    "kept": kept}))

    # --- GitHub ------------------------------------------------------------------------------------
    def _find(self) -> tuple[int, str] | None:
        """The oldest open or closed issue (not a pull request) with the label and the marker that
        the bot itself opened, in one request: a person can label an issue and quote the marker."""
        _, issues = self.repo.requester.requestJsonAndCheck(
            "GET", f"{self.repo.url}/issues",
            parameters={"state": "all", "labels": LABEL.name, "sort": "created", "direction": "asc", "per_page": 100})
        for issue in issues:
            author = (issue.get("user") or {}).get("login")
            if "pull_request" not in issue and render.find_marker(issue.get("body")) == ("log", 0, "") \
                    and render.authored_by(author, self.store.get_setting(BOT_LOGIN)):
                return int(issue["number"]), issue.get("body") or ""
        return None

    def _create(self, body: str, digest: str, now: float, kept: int) -> None:
        self._ensure_label()
        self.pace_write()
        issue = self.repo.create_issue(title=TITLE, body=body, labels=[LABEL.name])
        self._save(issue.number, digest, now, kept)
        log.info("opened the research log as issue #%s", issue.number)

    def _edit(self, number: int, body: str) -> bool:
        """One PATCH of the body (never its state: a closed log stays closed); False when it is gone."""
        self.pace_write()
        try:
            self.repo.requester.requestJsonAndCheck("PATCH", f"{self.repo.url}/issues/{number}", input={"body": body})
        except GithubException as error:
            if error.status in (404, 410):
                return False
            raise
        return True

    def _ensure_label(self) -> None:
        try:
            self.repo.get_label(LABEL.name)
        except GithubException as error:
            if error.status != 404:
                raise
            self.pace_write()
            try:
                self.repo.create_label(LABEL.name, LABEL.color, LABEL.description)
            except GithubException as again:
                if again.status != 422:  # 422: someone created it meanwhile
                    raise
