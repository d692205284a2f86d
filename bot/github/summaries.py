"""Experiments summarised in the research log instead of shown on a pull request of their own: what
the publisher does with a discarded, crashed or rejected experiment while the write budget is
degraded (bot.github.budget, bot.github.publisher). Each one is marked `summary` = `pending:<when>`
in the store's published rows when it finishes; they are posted together, one comment on the
research log's issue per batch (a row each: its title, verdict, value, change, reason and a link to
its commit, whose diff is the change), once BATCH are pending or the oldest has waited EVERY_S. An
experiment that never got a branch (bot.github.branches: the degraded mode pushes none for these)
has no commit to link: its diff against its main is in the comment instead, folded, at most
DIFF_CHARS of it.

Nothing is summarised twice: a batch is numbered and written to its experiments (`batch:<n>`)
before it is posted, and `posted:<n>:<comment id>` after; a batch found numbered but not posted
(its answer lost to a crash or a 502) is first looked for among the bot's own comments on the log
by its marker `<!-- autoresearch:summary:<n> -->`, and posted again only when it is not there.
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Callable

from github import GithubException
from github.Repository import Repository

from bot.github import render
from bot.store import Experiment, Store
from bot.views.read_model import shown_change, shown_value
from bot.views.text import bpb, cell, change_text, one_line, places
from runner.tasks import Metric

__all__ = ["BATCH", "DIFF_CHARS", "EVERY_S", "Summaries", "summary_comment"]

log = logging.getLogger(__name__)

BATCH = 20  # experiments in one comment at most (and a batch that is full is posted at once)
EVERY_S = 600.0  # the most a finished experiment waits for its batch
KEY = "summary"
DIFF_CHARS = 2500  # of one branchless experiment's diff in a comment (20 of them stay under GitHub's 65,536)


def summary_comment(
    batch: int, exps: list[Experiment], metric: Metric, html_url: str, diffs: dict[int, str] | None = None
) -> str:
    """The comment of one batch: its marker, why these have no pull request, a row each; `diffs`,
    the change of each experiment without a branch (by id), folded below the table."""
    diffs = diffs or {}
    n = places(metric)
    rows = [
        f"| {e.id} | {cell(one_line(e.title, 100))} | {e.status} | {bpb(shown_value(metric, e.val_bpb), n)} "
        f"| {change_text(metric, shown_change(metric, e.delta), n)} | {cell(one_line(e.reason, 160))} "
        + (f"| [`{e.head_sha[:7]}`]({html_url}/commit/{e.head_sha}) |" if e.head_sha else "| no branch: below |")
        for e in exps
    ]
    folded = [
        f"<details><summary>Experiment {e.id}: its change</summary>\n\n{_fenced(diffs[e.id])}\n\n</details>"
        for e in exps
        if not e.head_sha and e.id in diffs
    ]
    return "\n".join(
        [
            render.marker(KEY, batch),
            f"**{len(exps)} experiments without a pull request**: kept and promising experiments get "
            "their pull request, and while GitHub's write budget is degraded the rest are listed here "
            "once, as is one that ended before its first run started or its branch was pushed. A "
            "branch that was pushed is kept, and its commit shows the change; one never pushed has its "
            "change below.",
            "",
            f"| Experiment | Change | Verdict | {metric.name} | Δ vs main | Why | Commit |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            *(["", *folded] if folded else []),
        ]
    )


def change_diff(base: str, asset: str, path: str) -> str:
    """The unified diff of an asset against its main's, at most DIFF_CHARS of it."""
    lines = difflib.unified_diff(
        base.splitlines(keepends=True), asset.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    if len(text) > DIFF_CHARS:
        text = (
            text[:DIFF_CHARS].rsplit("\n", 1)[0]
            + f"\n... (cut at {DIFF_CHARS} characters; the bot's store keeps the whole file)\n"
        )
    return text


def _fenced(text: str) -> str:
    """`text` in a code fence no line of it can close."""
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}diff\n{text}{fence}"


class Summaries:
    def __init__(
        self,
        store: Store,
        repo: Repository,
        *,
        pace_write: Callable[[str], object] = lambda what: 0.0,
        clock: Callable[[], float] = time.time,
        change: Callable[[Experiment], str] = lambda exp: "",
    ) -> None:
        self.store = store
        self.repo = repo
        self.pace_write = pace_write
        self.clock = clock
        self.change = change  # the diff of an experiment never pushed (change_diff against its main)

    def add(self, exp: Experiment) -> None:
        """Mark a finished experiment to be summarised (once: one marked before is left as it is)."""
        if not self.store.published.get(exp.id).get(KEY):
            self.store.published.set(exp.id, KEY, f"pending:{self.clock()}")

    def post(self, metric: Metric, *, flush: bool = False) -> None:
        """Post the batch that is due (or, with `flush`, whatever is pending) on the research log."""
        number = self.store.state.research_log.get("number")
        if not number:
            return  # the log is opened first (bot.github.research_log)
        marks = self.store.published.with_key(KEY)
        numbered = sorted({int(v.split(":")[1]) for v in marks.values() if v.startswith("batch:")})
        if numbered:  # tried before, its answer lost: look for it first
            self._post(int(number), numbered[0], metric, look_first=True)
            return
        pending = sorted(i for i, v in marks.items() if v.startswith("pending:"))
        if not pending:
            return
        oldest = min(float(marks[i].split(":", 1)[1]) for i in pending)
        if not flush and len(pending) < BATCH and self.clock() - oldest < EVERY_S:
            return
        batch = 1 + max((int(v.split(":")[1]) for v in marks.values() if v.startswith("posted:")), default=0)
        with self.store.transaction():
            for exp_id in pending[:BATCH]:
                self.store.published.set(exp_id, KEY, f"batch:{batch}")
        self._post(int(number), batch, metric, look_first=False)

    def _post(self, number: int, batch: int, metric: Metric, *, look_first: bool) -> None:
        ids = sorted(i for i, v in self.store.published.with_key(KEY).items() if v == f"batch:{batch}")
        exps = sorted(self.store.experiments.several(set(ids)), key=lambda e: e.id)
        diffs = {e.id: self.change(e) for e in exps if not e.head_sha}
        body = summary_comment(batch, exps, metric, self.repo.html_url, diffs)
        found = self._find(number, batch) if look_first else None
        if found is None:
            self.pace_write("summary")
            try:
                found = self.repo.get_issue(number).create_comment(body).id
            except GithubException as error:
                if error.status in (404, 410):  # the log is gone: it is found again or opened anew first
                    log.info("research log #%s is gone: summary batch %s waits for it", number, batch)
                    return
                raise
        with self.store.transaction():
            for exp_id in ids:
                self.store.published.set(exp_id, KEY, f"posted:{batch}:{found}")
        log.info("summarised %d experiments on research log #%s (batch %s)", len(ids), number, batch)

    def _find(self, number: int, batch: int) -> int | None:
        wanted = (KEY, batch, "")
        for comment in self.repo.get_issue(number).get_comments():
            if render.authored_by(comment.user.login, self.store.state.bot_login) and (
                render.find_marker(comment.body) == wanted
            ):
                return comment.id
        return None
