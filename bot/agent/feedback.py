"""Human feedback: comments naming a constant ("try a lower matrix_lr") steer the bandit's arms.

`apply_feedback` finds the knob names (of any task's asset) in each comment (GPU names map to the
CPU constant on a CPU profile), the direction word nearest to each, and a negation ("don't touch
depth"). A named arm gets a bonus that beats any learned score until an experiment has followed
that comment; a negated one gets a penalty.
"""

from __future__ import annotations

import re

from bot.agent.arms import Arm
from bot.agent.knobs import KNOBS
from bot.core.records import HistoryEntry

FEEDBACK_BONUS = 5.0  # a human comment naming an arm beats any learned score

_DOWN_WORDS = (
    "lower",
    "down",
    "decrease",
    "decreasing",
    "smaller",
    "reduce",
    "less",
    "shorter",
    "fewer",
    "narrower",
    "shallower",
    "drop",
    "halve",
    "cut",
)
_UP_WORDS = (
    "higher",
    "up",
    "increase",
    "increasing",
    "bigger",
    "larger",
    "raise",
    "more",
    "longer",
    "wider",
    "deeper",
    "double",
    "boost",
)
_NEGATIONS = ("don't", "dont", "do not", "stop", "avoid", "no more", "never")


def _name_pattern(name: str) -> re.Pattern[str]:
    parts = [re.escape(p) for p in name.lower().split("_")]
    return re.compile(r"(?<![a-z0-9_])" + r"[_ \-]?".join(parts) + r"(?![a-z0-9_])")


def _nearest_direction(line: str, pos: int) -> int:
    best: tuple[int, int] | None = None
    for words, d in ((_DOWN_WORDS, -1), (_UP_WORDS, 1)):
        for w in words:
            for m in re.finditer(r"(?<![a-z])" + re.escape(w) + r"(?![a-z])", line):
                dist = abs(m.start() - pos)
                if best is None or dist < best[0]:
                    best = (dist, d)
    return best[1] if best else 0


def apply_feedback(arms: dict[tuple[str, int], Arm], feedback: list[str], history: list[HistoryEntry]) -> None:
    """Big bonus (or, for "don't touch X", a penalty) on the arms a human comment names."""
    live = {name for name, _ in arms}
    followed: dict[str, int] = {}
    for e in history:
        line = (e.meta or {}).get("feedback") if isinstance(e.meta, dict) else None
        if isinstance(line, str):
            followed[line] = followed.get(line, 0) + 1
    pending: dict[str, int] = {}
    for line in feedback:
        pending[line] = pending.get(line, 0) + 1
    # Longest names first, so "cpu_depth" is not read as "depth"; train.py's names, and the names
    # of whatever asset's knobs the arms are
    names = sorted({k.name for k in KNOBS} | live, key=len, reverse=True)
    for order, line in enumerate(feedback):
        low = line.lower()
        negated = False
        for n in _NEGATIONS:  # blank the negation out, so "no more" is not read as "more"
            pat = r"(?<![a-z])" + re.escape(n) + r"(?![a-z])"
            if re.search(pat, low):
                negated = True
                low = re.sub(pat, lambda m: " " * len(m.group(0)), low)
        if not negated and followed.get(line, 0) >= pending[line]:
            continue  # an experiment already followed this comment (as often as it was made)
        taken: list[tuple[int, int]] = []
        for name in names:
            for m in _name_pattern(name).finditer(low):
                if any(m.start() < b and a < m.end() for a, b in taken):
                    continue
                taken.append((m.start(), m.end()))
                target = name
                if target not in live:  # "depth" on a CPU profile means CPU_DEPTH
                    alt = f"CPU_{name}" if not name.startswith("CPU_") else name[4:]
                    if alt not in live:
                        continue
                    target = alt
                d = _nearest_direction(low, m.start())
                for direction in (d,) if d else (1, -1):
                    arm = arms[(target, direction)]
                    if negated:
                        arm.feedback -= FEEDBACK_BONUS
                    else:
                        arm.feedback += FEEDBACK_BONUS + 0.01 * order  # later comments win ties
                        arm.feedback_line = line
