"""Everything the bot shows on GitHub, as text: pull request titles and bodies, check run titles,
summaries and logs, commit status descriptions, comments, labels, and the hidden markers the bot
finds its own content by.

Pure functions of the store's records (no I/O, no GitHub calls), so every limit GitHub enforces is
kept here and tested here: a PR body of at most 65,536 characters, check run fields of at most
65,535, a status description of at most 140. Text that comes from outside the bot (the agent's
hypothesis, a training log, a person's comment) is never trusted to be short, single-line or free
of markers: it is clipped with a visible note and a marker inside it is broken, so `find_marker`
only ever finds the one the bot wrote, and it loses its control and bidirectional formatting
characters (`plain`, applied by every renderer here), so nothing the bot repeats rings a terminal
or reads right to left. A marker is also only ever believed in what the bot's own login authored
(bot.github.publisher, bot.github.research_log check the author). Limits are kept in characters and in UTF-8 bytes alike,
since a character can be four bytes and we do not rely on which of the two GitHub counts.

The numbers speak the task's metric (`metric`, training's val_bpb by default): named, on its own
scale and with its decimals. The store's records hold them on the judge's loss scale, so every value
shown goes through bot.views.read_model.shown_value (Metric.value), every delta through
Metric.format_change (a difference in the metric's units, or for a log-scale metric such as a latency
a relative change, "-98.6%"), and every margin, a magnitude on the loss scale, through
Metric.format_margin ("0.002000", or "47.2%"). The words follow the task too: its asset's name where a text
names the edited file, "running" where training's say "training" (training's texts are as before).
"""

from __future__ import annotations

import difflib
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bot.core.records import full_budget
from bot.core.simplicity import simplification
from bot.store import Experiment, Run
from bot.views.read_model import kept_for_simplicity, shown_value
from bot.views.text import bpb as _bpb
from bot.views.text import cell as _cell
from bot.views.text import clean as _clean
from bot.views.text import cut_to as _limit
from bot.views.text import defang as _defang
from bot.views.text import fits as _fits
from bot.views.text import head as _head
from bot.views.text import one_line as _one_line
from bot.views.text import places as _places
from bot.views.text import plural as _plural
from runner.tasks import TRAINING, Metric, Task

PR_TITLE_LIMIT = 256
PR_BODY_LIMIT = 65_536  # also an issue comment's
CHECK_TITLE_LIMIT = 1_000
CHECK_FIELD_LIMIT = 65_535  # a check run's summary and text
STATUS_DESCRIPTION_LIMIT = 140
HISTORY_SHOWN = 5  # finished experiments listed in a PR body
RUNS_SHOWN = 50  # runs listed one by one in a check summary
ERROR_LINES_SHOWN = 40  # traceback lines quoted in a crash comment

# --- markers: the idempotency keys of everything the bot posts ------------------------------------

_MARKER = re.compile(r"<!-- autoresearch:(?P<kind>[a-z][a-z0-9_-]*):(?P<id>\d+)(?::(?P<extra>[A-Za-z0-9_.-]+))? -->")
_KIND = re.compile(r"[a-z][a-z0-9_-]*")
_EXTRA = re.compile(r"[A-Za-z0-9_.-]*")


def marker(kind: str, exp_id: int, extra: str = "") -> str:
    """A hidden HTML comment naming what a body or comment is: `<!-- autoresearch:pr:12 -->`,
    `<!-- autoresearch:decision:12:keep -->`, `<!-- autoresearch:ack:<comment id> -->`."""
    if not _KIND.fullmatch(kind) or not _EXTRA.fullmatch(extra) or exp_id < 0:
        raise ValueError(
            f"a marker needs a lowercase kind, an id >= 0 and an extra of letters, digits, '_.-': "
            f"got {kind!r}, {exp_id!r}, {extra!r}"
        )
    return f"<!-- autoresearch:{kind}:{exp_id}{':' + extra if extra else ''} -->"


def find_marker(text: str | None) -> tuple[str, int, str] | None:
    """(kind, id, extra) of the first marker in `text`, or None."""
    found = _MARKER.search(text or "")
    return (found["kind"], int(found["id"]), found["extra"] or "") if found else None


def authored_by(login: str | None, bot_login: str | None) -> bool:
    """Whether content whose author is `login` is the bot's own (`bot_login`: the App's
    "<slug>[bot]", or the token's user): a marker counts only there. Unknown either way: no."""
    return bool(login) and bool(bot_login) and (login or "").lower() == (bot_login or "").lower()


# --- limits ---------------------------------------------------------------------------------------


def _tail(text: str, limit: int) -> str:
    """The longest end of `text` within `limit` UTF-8 bytes, cut between characters."""
    data = text.encode()
    return data[len(data) - max(0, limit) :].decode("utf-8", "ignore") if limit > 0 else ""


# --- numbers --------------------------------------------------------------------------------------


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class _Shown:
    """How the texts show a metric's numbers, the store's (the loss scale): a value as the metric's, a
    delta as the change it means, a margin as people read it (Metric.format_change, format_margin),
    with the metric's decimals (bot.views.text.places)."""

    def __init__(self, metric: Metric) -> None:
        self.name = metric.name
        self.metric = metric
        self.places = _places(metric)

    def value(self, loss: float | None) -> str:
        return _bpb(shown_value(self.metric, loss), self.places)

    def delta(self, delta: float | None) -> str:
        return "—" if delta is None else self.metric.format_change(delta, self.places)

    def margin(self, margin: float | None) -> str:
        return "—" if margin is None else self.metric.format_margin(margin, self.places)


def _delta(exp: Experiment, val_bpb: float | None, main_val_bpb: float | None) -> float | None:
    if exp.delta is not None:
        return exp.delta
    return val_bpb - main_val_bpb if val_bpb is not None and main_val_bpb is not None else None


def _main_value(exp: Experiment, main_val_bpb: float | None) -> float | None:
    """main's val_bpb as given, else as the decision saw it (the candidate's value minus its delta)."""
    if main_val_bpb is not None:
        return main_val_bpb
    if isinstance(exp.meta.get("main_val_bpb"), (int, float)):
        return float(exp.meta["main_val_bpb"])
    return exp.val_bpb - exp.delta if exp.val_bpb is not None and exp.delta is not None else None


def _counted(runs: Iterable[Run]) -> list[Run]:
    """The runs whose val_bpb counts: finished, ok, with a value, at the full budget (a screening's
    short run is another measurement: bot.loop.screening)."""
    return [
        r for r in runs if r.state == "done" and r.status == "ok" and r.val_bpb is not None and full_budget(r.purpose)
    ]


def _fenced(text: str, info: str = "") -> str:
    """`text` in a code fence no line of it can close: backticks or tildes, whichever the text has
    shorter runs of, one more than its longest run."""
    fences = []
    for char in "`~":
        longest = max((len(run) for run in re.findall(re.escape(char) + "+", text)), default=0)
        fences.append(char * max(3, longest + 1))
    fence = min(fences, key=len)
    return f"{fence}{info}\n{text}\n{fence}"


def _last_error_line(exp: Experiment) -> str:
    for source in (exp.error_tail, exp.reason):
        lines = [line.strip() for line in (source or "").splitlines() if line.strip()]
        if lines:
            return lines[-1].removeprefix("the run crashed: ")
    return "no error output"


# --- labels and conclusions -----------------------------------------------------------------------


@dataclass(frozen=True)
class Label:
    name: str
    color: str  # six hex digits, no '#'
    description: str  # at most 100 characters


# The verdicts. An experiment in flight carries none: its check run (or commit status) shows it.
LABELS: dict[str, Label] = {
    "keep": Label(
        "autoresearch: kept", "0e8a16", "Beat main by more than the noise margin, or matched it with less code; merged"
    ),
    "discard": Label("autoresearch: discarded", "cfd3d7", "Not a measurable gain over main; kept as a record"),
    "crash": Label("autoresearch: crashed", "d73a4a", "Its training run crashed; the traceback goes to the agent"),
    "rejected": Label(
        "autoresearch: rejected",
        "e99695",
        "Its run failed a check before it was measured; the reason goes to the agent",
    ),
    "cancelled": Label("autoresearch: cancelled", "6a737d", "Stopped by a person before a decision"),
    "failed": Label("autoresearch: failed", "b60205", "The bot could not finish it (a step kept failing)"),
}
# another task's run is an evaluation (one its gate rejects is `rejected`, labelled apart)
_TASK_CRASH = "Its run crashed or ran out of time; the reason goes to the agent"


def label(status: str, task: Task = TRAINING) -> Label:
    """The verdict label of a finished experiment's status, in the words of `task` (the names are the
    same for every task: a repository holds one)."""
    found = LABELS[status]
    if status == "crash" and task.name != TRAINING.name:
        return Label(found.name, found.color, _TASK_CRASH)
    return found


_CONCLUSIONS = {
    "keep": "success",
    "discard": "neutral",
    "crash": "failure",
    "rejected": "failure",
    "failed": "failure",
    "cancelled": "cancelled",
}
_OUTCOME_WORDS = {
    "keep": "kept",
    "discard": "discarded",
    "crash": "crashed",
    "rejected": "rejected",
    "failed": "failed",
    "cancelled": "cancelled",
}


def conclusion(status: str) -> str:
    """The check run conclusion of a finished experiment's status."""
    try:
        return _CONCLUSIONS[status]
    except KeyError:
        raise ValueError(f"no check conclusion for status {status!r}: one of {', '.join(_CONCLUSIONS)}") from None


# --- the pull request -----------------------------------------------------------------------------


def pr_title(exp: Experiment) -> str:
    """`[autoresearch #12] Raise MATRIX_LR 0.04 -> 0.05`, on one line, at most 256 characters."""
    prefix = f"[autoresearch #{exp.id}] "
    return prefix + _one_line(exp.title or f"experiment {exp.id}", PR_TITLE_LIMIT - len(prefix))


def diff_size(before: str, after: str) -> tuple[int, int]:
    """(lines added, lines removed) from `before` to `after`, as a line diff counts them."""
    a, b = before.splitlines(), after.splitlines()
    added = removed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            removed += i2 - i1
            added += j2 - j1
    return added, removed


def _expected(meta: dict[str, Any], metric: Metric) -> str:
    """The agent's expected effect: its words, or its number (in the metric's units)."""
    for key in ("expected", "expected_effect", "expected_delta"):
        value = meta.get(key)
        if _number(value) is not None:
            return f"{metric.name} {value:+.{metric.digits + 1}f} vs main."
        if isinstance(value, str) and value.strip():
            return _defang(value.strip()[:4_000])
    return "Not stated by the agent."


def agent_cost(meta: dict[str, Any]) -> str:
    """What proposing this experiment cost (an LLM agent's answer, skipped attempts included), or ""."""
    cost = _number(meta.get("cost_usd"))
    if cost is None:
        return ""
    usage = meta.get("usage") if isinstance(meta.get("usage"), dict) else {}
    parts = [
        f"{int(usage[k]):,} {label}"
        for k, label in (
            ("input_tokens", "input"),
            ("cache_read_input_tokens", "cache read"),
            ("cache_creation_input_tokens", "cache write"),
            ("output_tokens", "output"),
        )
        if _number(usage.get(k))
    ]
    model = f" ({_one_line(str(meta['model']), 80)})" if meta.get("model") else ""
    return f"${cost:.4f}{model}" + (f": {', '.join(parts)} tokens" if parts else "")


def _changes(meta: dict[str, Any]) -> list[str]:
    """The explorer's named edits (`meta["changes"]`), one bullet each."""
    changes = meta.get("changes")
    if not isinstance(changes, list):
        return []
    lines = []
    for change in changes[:20]:
        if isinstance(change, dict) and "name" in change:
            lines.append(_defang(_one_line(f"- `{change['name']}`: {change.get('old')} → {change.get('new')}", 300)))
    return lines


_STEERING = """\
## Steering

Comments from people with write access to this repository reach the agent. A comment that starts \
with one of these commands acts on this experiment:

| Command | What it does |
| --- | --- |
| `/rerun` | one more run of this {asset} (a finished experiment is measured afresh) |
| `/keep` | merge it once measured on the current main, whatever the judge says |
| `/discard` | stop its runs and close it as discarded |
| `/pause` | stop proposing new experiments (runs already started finish) |
| `/resume` | start proposing again |
| `/try <idea>` | an idea for the agent's next proposals |"""


def steering(asset: str) -> str:
    """The PR body's section on the commands people may comment, naming the task's asset."""
    return _STEERING.format(asset=asset)


def _history(exp: Experiment, history: list[Experiment], shown: _Shown) -> str:
    done = sorted((e for e in history if e.status and e.id != exp.id), key=lambda e: e.id)[-HISTORY_SHOWN:]
    if not done:
        return "No experiment has finished yet."
    rows = [f"| Experiment | Status | {shown.name} | Δ vs main |", "| --- | --- | --- | --- |"]
    for e in reversed(done):
        crashed = e.status in ("crash", "rejected", "failed")
        rows.append(
            f"| #{e.id} {_cell(_one_line(e.title, 80))} | {_OUTCOME_WORDS.get(e.status, e.status)} "
            f"| {'—' if crashed else shown.value(e.val_bpb)} | {'—' if crashed else shown.delta(e.delta)} |"
        )
    return "\n".join(rows)


def pr_body(
    exp: Experiment,
    *,
    main_sha: str,
    main_val_bpb: float | None,
    base_asset: str,
    history: list[Experiment],
    task: Task = TRAINING,
) -> str:
    """The PR description: hypothesis, expected effect, diff size, what it builds on, how to steer;
    the asset and the metric are `task`'s."""
    asset, shown = task.asset, _Shown(task.metric)
    if exp.asset is None:
        size = f"The proposed {asset} is not recorded yet."
    else:
        added, removed = diff_size(base_asset, exp.asset)
        size = f"`{asset}`: **+{added} −{removed}** lines against main `{main_sha[:7]}`."
        smaller = simplification(base_asset, exp.asset)
        if smaller:
            size += (
                f" It makes {asset} smaller: {smaller.words()}, counted without comments, docstrings "
                f"or layout. A smaller {asset} may be kept for simplicity: when its runs rule out a loss "
                f"larger than `simplicity_sigmas` (program.md) times the noise."
            )
    changes = _changes(exp.meta)
    if isinstance(exp.meta.get("fixes"), int):
        ended = "was rejected" if exp.meta.get("fixes_status") == "rejected" else "crashed"
        changes.append(f"It is proposed as the fix of experiment {exp.meta['fixes']}, which {ended}.")
    main_words = (
        f"{shown.name} **{shown.value(main_val_bpb)}**"
        if main_val_bpb is not None
        else f"{shown.name} not measured yet"
    )
    cost = agent_cost(exp.meta)
    risk = exp.meta.get("risk") if isinstance(exp.meta.get("risk"), str) else ""
    rest = "\n\n".join(
        [
            "## Expected effect",
            _expected(exp.meta, task.metric) + (f"\n\nRisk: {_defang(risk.strip()[:2_000])}" if risk.strip() else ""),
            "## The change",
            "\n".join([size, *changes]),
            "## What it builds on",
            f"Main `{main_sha[:7]}` (this branch's base): {main_words}. The last finished experiments:",
            _history(exp, history, shown),
            *([f"Proposing it cost {cost}."] if cost else []),
            steering(asset),
        ]
    )
    head = f"{marker('pr', exp.id)}\n## Hypothesis\n\n"
    hypothesis = _clean(_defang(exp.hypothesis.strip() or "Not stated by the agent."))
    rest = _clean(rest)
    room = PR_BODY_LIMIT - len(f"{head}\n\n{rest}".encode())
    if not _fits(hypothesis, room):
        note = "\n\n*… the hypothesis is cut here: the full text is in the branch's commit message.*"
        hypothesis = _head(hypothesis, room - len(note.encode())).rstrip() + note
    return _limit(f"{head}{hypothesis}\n\n{rest}", PR_BODY_LIMIT)


# --- check runs and commit statuses ---------------------------------------------------------------


def _numbers(
    metric: Metric, val_bpb: float | None, delta: float | None, margin: float | None, loss_margin: float | None = None
) -> str:
    """`val_bpb 0.97120 (-0.00610 vs main, noise margin 0.00200)`, one decimal more than the metric's
    own (val_bpb's 5), the store's numbers on the metric's terms (`p95_ms 20.00 (-98.6% vs main, noise
    margin 12.3%)` on a log scale); with a loss margin (a
    keep for simplicity) `loss margin 0.01000` instead of the noise margin."""
    if val_bpb is None:
        return ""
    n = metric.digits + 1
    parts = [f"{metric.format_change(delta, n)} vs main" if delta is not None else "no main baseline yet"]
    if loss_margin is not None:
        parts.append(f"loss margin {metric.format_margin(loss_margin, n)}")
    elif margin is not None:
        parts.append(f"noise margin {metric.format_margin(margin, n)}")
    return f"{metric.name} {metric.value(val_bpb):.{n}f} ({', '.join(parts)})"


def check_title(
    exp: Experiment,
    *,
    status: str,
    val_bpb: float | None = None,
    delta: float | None = None,
    margin: float | None = None,
    ahead: int | None = None,
    progress: dict[str, Any] | None = None,
    metric: Metric = TRAINING.metric,
) -> str:
    """One line for a check run: a finished status (keep, discard, crash, rejected, failed, cancelled) with
    its numbers (the experiment's own when not given; store numbers, shown in `metric`), `queued`
    with the runs ahead of it, or `running` with the latest progress line."""
    if status == "queued":
        title = (
            "queued"
            if ahead is None
            else ("queued (next to run)" if ahead == 0 else f"queued ({_plural(ahead, 'run')} ahead)")
        )
    elif status in ("running", "in_progress"):
        title = _running(progress or {}, "training" if metric == TRAINING.metric else "running")
    elif status == "crash":
        title = f"crashed: {_last_error_line(exp)}"
    elif status == "rejected":
        title = exp.reason or "rejected"  # the judge's "rejected: <why>"
    elif status in _OUTCOME_WORDS:
        simpler = kept_for_simplicity(exp) if status == "keep" else None
        numbers = _numbers(
            metric,
            val_bpb if val_bpb is not None else exp.val_bpb,
            delta if delta is not None else exp.delta,
            margin if margin is not None else exp.margin,
            simpler.loss_margin if simpler else None,
        )
        word = simpler.words() if simpler else _OUTCOME_WORDS[status]
        title = f"{numbers}: {word}" if numbers else f"{word}: {exp.reason}" if exp.reason else word
    else:
        raise ValueError(f"no check title for status {status!r}: one of queued, running, {', '.join(_OUTCOME_WORDS)}")
    return _one_line(_clean(title), CHECK_TITLE_LIMIT)


def _running(progress: dict[str, Any], word: str) -> str:
    """`training: step 120, loss 3.412, 2m10s left` (another task's run: `running: ...`, or `running`)."""
    parts = []
    if isinstance(progress.get("step"), int):
        parts.append(f"step {progress['step']}")
    if isinstance(progress.get("loss"), (int, float)):
        parts.append(f"loss {progress['loss']:.3f}")
    if isinstance(progress.get("remaining_seconds"), (int, float)):
        parts.append(f"{_duration(progress['remaining_seconds'])} left")
    if parts:
        return f"{word}: {', '.join(parts)}"
    return "training: starting" if word == "training" else word


def status_description(
    exp: Experiment,
    *,
    status: str,
    val_bpb: float | None = None,
    delta: float | None = None,
    margin: float | None = None,
    ahead: int | None = None,
    progress: dict[str, Any] | None = None,
    metric: Metric = TRAINING.metric,
) -> str:
    """The commit status fallback (no App): the check title, at most 140 characters."""
    title = check_title(
        exp, status=status, val_bpb=val_bpb, delta=delta, margin=margin, ahead=ahead, progress=progress, metric=metric
    )
    return _one_line(title, STATUS_DESCRIPTION_LIMIT)


# (label, result.json key, how the values of several runs combine, how one value reads)
_METRICS: list[tuple[str, str, Callable[[list[float]], float], Callable[[float], str]]] = [
    ("Peak memory", "peak_vram_mb", max, lambda v: f"{v / 1024:.2f} GB"),
    ("MFU", "mfu_percent", statistics.fmean, lambda v: f"{v:.2f}%"),
    ("Tokens", "total_tokens_M", statistics.fmean, lambda v: f"{v:.1f}M"),
    ("Steps", "num_steps", statistics.fmean, lambda v: f"{v:,.0f}"),
    ("Parameters", "num_params_M", statistics.fmean, lambda v: f"{v:.1f}M"),
    ("Training seconds", "training_seconds", statistics.fmean, lambda v: f"{v:.1f}"),
    ("Total seconds", "total_seconds", statistics.fmean, lambda v: f"{v:.1f}"),
]


def _metric(runs: list[Run], key: str) -> list[float]:
    return [value for r in runs if (value := _number(r.metrics.get(key))) is not None]


def check_summary(
    exp: Experiment,
    runs: list[Run],
    *,
    main_val_bpb: float | None,
    noise_margin: float | None,
    metric: Metric = TRAINING.metric,
) -> str:
    """The check run summary: the numbers of the experiment and of each of its runs (store numbers,
    shown in `metric`), and the decision."""
    shown = _Shown(metric)
    counted = _counted(runs)
    value = (
        exp.val_bpb if exp.val_bpb is not None else (statistics.fmean(r.val_bpb for r in counted) if counted else None)
    )
    margin = noise_margin if noise_margin is not None else exp.margin
    values = ", ".join(shown.value(r.val_bpb) for r in counted)
    rows = [
        "| | |",
        "| --- | --- |",
        f"| {shown.name} | {shown.value(value)}{f' (mean of {len(counted)})' if len(counted) > 1 else ''} |",
        f"| main | {shown.value(main_val_bpb) if main_val_bpb is not None else 'not measured yet'} |",
        f"| Δ vs main | {shown.delta(_delta(exp, value, main_val_bpb))} |",
        f"| Noise margin | {shown.margin(margin) if margin is not None else 'not known yet'} |",
        *_simplicity_row(exp, shown),
        f"| Runs | {len(counted)}{': ' + values if values else ''} |",
    ]
    for name, key, combine, show in _METRICS:  # training's figures; another task shows those its runs report
        found = _metric(counted, key)
        if found or metric == TRAINING.metric:
            rows.append(f"| {name} | {show(combine(found)) if found else '—'} |")
    if agent_cost(exp.meta):
        rows.append(f"| Agent cost | {_cell(agent_cost(exp.meta))} |")
    decision = _defang(exp.reason) if exp.reason else "No decision yet."
    parts = ["\n".join(rows), f"**Decision:** {decision}"]
    if runs:
        listed = [
            f"| Run | Purpose | State | {shown.name} | Steps | Seconds | Note |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in runs[-RUNS_SHOWN:]:
            state = r.state if r.state != "done" else (r.status or "done")
            steps, seconds = r.metrics.get("num_steps"), r.metrics.get("total_seconds")
            note = _one_line(r.note or _last_line(r.error), 120)
            if r.metrics.get("sandboxed") is False:
                note = f"unsandboxed; {note}" if note else "unsandboxed"
            if isinstance(r.metrics.get("actions_url"), str) and r.metrics["actions_url"].startswith("https://"):
                note = f"[Actions log]({r.metrics['actions_url']}) {note}".rstrip()
            listed.append(
                f"| {r.id} | {r.purpose} | {state} | {shown.value(r.val_bpb)} | {steps if steps is not None else '—'} "
                f"| {f'{seconds:.1f}' if isinstance(seconds, (int, float)) else '—'} | {_cell(note)} |"
            )
        if len(runs) > RUNS_SHOWN:
            listed.append(f"\n*{len(runs) - RUNS_SHOWN} earlier runs are not listed.*")
        parts.append("\n".join(listed))
    return _limit("\n\n".join(parts), CHECK_FIELD_LIMIT)


def _simplicity_row(exp: Experiment, shown: _Shown) -> list[str]:
    """The table row of a keep for simplicity: how much smaller, and the loss its runs ruled out."""
    simpler = kept_for_simplicity(exp)
    if simpler is None:
        return []
    return [
        f"| Kept for simplicity | {simpler.smaller.words()}; its runs rule out a loss larger than "
        f"{shown.margin(simpler.loss_margin)} |"
    ]


def _last_line(text: str | None) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def check_text(log_tail: str | None) -> str:
    """The training log in a code block; when it is too long for GitHub, its end (the part that
    says what went wrong) is kept, from a line start, under a note saying how much was cut."""
    # a carriage return redraws a progress line: keep what it last showed, before `_clean` drops it
    lines = [line.rstrip("\r").split("\r")[-1] for line in _ANSI.sub("", log_tail or "").split("\n")]
    lines = [_clean(line) for line in lines]
    log = _defang("\n".join(lines).strip("\n"))
    if not log.strip():
        return "No log output was captured."
    budget = CHECK_FIELD_LIMIT - 200  # room for the note
    while True:
        kept = log
        if not _fits(log, budget):
            kept = _tail(log, budget)
            if "\n" in kept:
                kept = kept[kept.index("\n") + 1 :]  # start at a whole line
        note = ""
        if kept != log:
            cut = log[: len(log) - len(kept)]
            note = (
                f"*The log is longer than GitHub shows: its first {len(cut):,} characters "
                f"({cut.count(chr(10)):,} lines) are cut; its end follows.*\n\n"
            )
        text = note + _fenced(kept, "text")
        if _fits(text, CHECK_FIELD_LIMIT):
            return text
        budget -= len(text.encode()) - CHECK_FIELD_LIMIT + 16  # a longer fence than expected


def progress_summary(progress: dict[str, Any] | None, budget_s: float | None) -> str:
    """An in-progress check's summary: step, loss, time used and left, percent of the budget (the
    progress line's own fields, see runner.harness; the budget from them when not given)."""
    if not progress:
        return "Training has started; no progress reported yet."
    elapsed, left, loss, done = (
        _number(progress.get(key)) for key in ("training_seconds", "remaining_seconds", "loss", "progress")
    )
    if budget_s is None and elapsed is not None and left is not None:
        budget_s = elapsed + left
    if elapsed is not None and budget_s:
        done = done if done is not None else min(1.0, elapsed / budget_s)
        left = left if left is not None else max(0.0, budget_s - elapsed)
    rows = [
        "| | |",
        "| --- | --- |",
        f"| Step | {_cell(str(progress.get('step', '—')))} |",
        f"| Loss | {_bpb(loss, 4)} |",
        f"| Elapsed | {_duration(elapsed)}{f' of {_duration(budget_s)}' if budget_s else ''} |",
        f"| Left | {_duration(left)} |",
        f"| Done | {f'{100 * done:.1f}%' if done is not None else '—'} |",
    ]
    return _limit("\n".join(rows), CHECK_FIELD_LIMIT)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# --- comments -------------------------------------------------------------------------------------


def _next_step(exp: Experiment) -> str:
    if exp.status == "keep":
        where = f"as `{exp.merged_sha[:7]}`" if exp.merged_sha else "(the merge is under way)"
        return (
            f"Merged into main {where}. The new main is measured afresh, and that re-measured delta "
            f"is the one to quote; the next proposals build on it."
        )
    branch = f"The branch `{exp.branch}`" if exp.branch else "The branch"
    if exp.status == "discard":
        return f"{branch} is kept as a record, not merged. The agent sees this result in its history."
    if exp.status == "crash":
        return f"{branch} is kept as a record. The traceback below is given to the next proposal."
    if exp.status == "rejected":
        return f"{branch} is kept as a record, not merged. The reason it was rejected is given to the next proposal."
    if exp.status == "cancelled":
        return f"Nothing was merged; {branch[0].lower()}{branch[1:]} is kept as a record. `/rerun` measures it again."
    if exp.status == "failed":
        return (
            f"The bot gave up after {_plural(exp.failures, 'failed attempt')}; nothing was merged. "
            f"`/rerun` tries it again."
        )
    return "No decision yet."


def decision_comment(
    exp: Experiment, *, main_val_bpb: float | None, runs: list[Run], metric: Metric = TRAINING.metric
) -> str:
    """Why the experiment ended as it did, in numbers (store numbers, shown in `metric`), and what
    happens next."""
    shown = _Shown(metric)
    status = exp.status or "undecided"
    word = "kept for simplicity" if kept_for_simplicity(exp) else _OUTCOME_WORDS.get(status, status)
    counted = _counted(runs)
    main = _main_value(exp, main_val_bpb)
    lines = [
        marker("decision", exp.id, status if re.fullmatch(r"[a-z]+", status) else ""),
        f"### {word.capitalize()}: {_defang(_one_line(exp.title, 200))}",
        "",
        f"**Why:** {_defang(exp.reason) if exp.reason else 'no reason recorded.'}",
        "",
    ]
    if status not in ("crash", "rejected", "failed") and (exp.val_bpb is not None or counted):
        values = ", ".join(shown.value(r.val_bpb) for r in counted) or "—"
        lines += [
            "| | |",
            "| --- | --- |",
            f"| {shown.name} | {shown.value(exp.val_bpb)} |",
            f"| main | {shown.value(main) if main is not None else 'not measured yet'} |",
            f"| Δ vs main | {shown.delta(_delta(exp, exp.val_bpb, main))} |",
            f"| Noise margin | {shown.margin(exp.margin) if exp.margin is not None else 'not known yet'} |",
            *_simplicity_row(exp, shown),
            f"| Runs | {len(counted)}: {values} |",
        ]
        if exp.remeasured_delta is not None:
            lines.append(f"| Δ re-measured on the new main | {shown.delta(exp.remeasured_delta)} |")
        lines.append("")
    lines.append(f"**Next:** {_next_step(exp)}")
    if status == "crash":
        error = "\n".join((exp.error_tail or _last_error_line(exp)).strip().splitlines()[-ERROR_LINES_SHOWN:])
        lines += ["", _fenced(_defang(_head(_clean(error), 20_000)), "text")]
    return _limit("\n".join(lines), PR_BODY_LIMIT)


def ack_comment(command: str, argument: str, outcome: str, comment_id: int) -> str:
    """The reply to a person's `/command`: what was asked (quoted) and what the bot did about it."""
    asked = _head(_clean(f"/{command.lstrip('/')} {argument}".strip()), 2_000)
    quoted = "\n".join(f"> {line}" for line in _defang(asked).splitlines())
    return _limit(f"{marker('ack', comment_id)}\n{quoted}\n\n{_defang(outcome)}", PR_BODY_LIMIT)
