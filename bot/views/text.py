"""Text for people, safe to repeat where others read it: numbers as the views and GitHub show them,
one-line clips, Markdown table cells, a length limit kept in characters and UTF-8 bytes alike, and
`plain`, the one sanitizer of everything the bot repeats from outside (a hypothesis, a title, a log,
a comment). Pure functions; bot.github.render builds what GitHub shows from them, and the research
log's text (bot.views.research_log) too.
"""

from __future__ import annotations

import re

from runner.tasks import Metric


def defang(text: str) -> str:
    """Break every HTML comment opener in text the bot did not write (a zero-width space keeps it
    looking the same), so no hypothesis, log or comment can carry a marker of its own."""
    return text.replace("<!--", "<!\u200b--")


# Control characters (Unicode category Cc) but newline and tab, and the bidirectional formatting
# characters (embeddings and overrides U+202A-202E, isolates U+2066-2069, the marks U+200E, U+200F
# and U+061C): a BEL or a right-to-left override in a comment must not come back in what the bot
# writes, where it would ring a terminal or make text read other than it is.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain(text: str) -> str:
    """`text` without control characters (newline and tab stay; a carriage return goes, so CRLF
    reads as LF) and without bidirectional formatting characters: the one sanitizer of everything
    the bot repeats from outside (comments, commands, feedback, titles, logs)."""
    return _UNSAFE.sub("", text)


def clean(text: str) -> str:
    """Text GitHub's API accepts and that shows as it reads: no lone surrogate (a log decoded with
    surrogateescape), no control or bidirectional formatting character (`plain`)."""
    return plain(text.encode("utf-8", "replace").decode("utf-8"))


def fits(text: str, limit: int) -> bool:
    return len(text.encode()) <= limit  # bytes >= characters, so characters fit too


def head(text: str, limit: int) -> str:
    """The longest start of `text` within `limit` UTF-8 bytes, cut between characters."""
    return text.encode()[: max(0, limit)].decode("utf-8", "ignore")


def cut_to(text: str, limit: int) -> str:
    """`text` cut to `limit` (characters and bytes) at its end, saying so where it was cut."""
    text = clean(text)
    if fits(text, limit):
        return text
    note = f"\n\n*… cut here: GitHub shows at most {limit:,} characters.*"
    return head(text, limit - len(note.encode())).rstrip() + note


def one_line(text: str | None, limit: int) -> str:
    """Whitespace collapsed to single spaces, clipped to `limit` characters with an ellipsis."""
    words = " ".join(plain(text or "").split())
    return words if len(words) <= limit else words[: limit - 1].rstrip() + "…"


def places(metric: Metric) -> int:
    """Decimals the views show of a metric's values and deltas: two beyond the metric's own (a change
    between runs is finer than a value is read), so val_bpb keeps its six, p95_ms shows four."""
    return metric.digits + 2


def bpb(value: float | None, places: int = 6) -> str:
    return "—" if value is None else f"{value:.{places}f}"


def signed(value: float | None, places: int = 6) -> str:
    return "—" if value is None else f"{value:+.{places}f}"


def change_text(metric: Metric, change: float | None, places: int = 6, missing: str = "—") -> str:
    """A delta as the views carry it (bot.views.read_model.shown_change), signed: in the metric's
    units with `places` decimals ("+0.001630"), or for a log-scale metric a percentage ("-98.6%")."""
    if change is None:
        return missing
    return f"{100 * change:+.1f}%" if metric.relative else f"{change:+.{places}f}"


def margin_text(metric: Metric, margin: float | None, places: int = 6, missing: str = "—") -> str:
    """A margin (the judge's, a magnitude on the loss scale) as people read it (Metric.format_margin):
    "0.002000", or for a log-scale metric the relative change it allows ("47.2%")."""
    return missing if margin is None else metric.format_margin(margin, places)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return defang(" ".join(text.split()).replace("|", "\\|"))
