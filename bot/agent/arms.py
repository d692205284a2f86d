"""The bandit's arms and what history says about them.

Every (constant, direction) pair is an arm. `learn` attaches each earlier experiment whose
``meta["changes"]`` names an arm to it as an `Outcome` (keep +1, discard that hurt -1, discard that
improved but not enough to keep +0.25, crash -1; the opposite direction counts half, mirrored;
recent outcomes weigh more) and scores the arm: ``mean + C * sqrt(ln(N + 1) / (n + 1))``. An arm
lists the candidate values one step away, in the step sizes its last outcome suggests, short of
any value that crashed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bot.agent.constants import Constant
from bot.agent.crash_memory import crash_state
from bot.agent.knobs import KNOB_BY_NAME, Knob, order_key, step_value
from bot.core.records import HistoryEntry
from bot.core.states import NO_NUMBER

EXPLORATION = 0.5  # C in the UCB bonus
OPPOSITE_WEIGHT = 0.5  # how much an outcome of the other direction counts, mirrored
RECENCY_DECAY = 0.97  # weight of an outcome per later experiment
SIZES = {"small": 0.5, "normal": 1.0, "big": 1.5}


@dataclass
class Outcome:
    """One earlier experiment's verdict on one (knob, direction) arm."""

    entry: HistoryEntry
    old: Any
    new: Any
    direction: int
    reward: float
    weight: float
    combined: bool
    crash: str = ""  # for a crash: "blocking", "expired" (CRASH_MEMORY ago) or "other code"


@dataclass
class Arm:
    """One (knob, direction) pair: its outcomes so far, its score and the values it may try next."""

    knob: Knob
    const: Constant
    direction: int
    outcomes: list[Outcome] = field(default_factory=list)  # this direction, oldest first
    mirrored: list[Outcome] = field(default_factory=list)  # the other direction, oldest first
    crashes: list[Any] = field(default_factory=list)  # values in this direction that crashed
    q: float = 0.0
    bonus: float = 0.0
    feedback: float = 0.0
    feedback_line: str | None = None
    jitter: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        return (self.knob.name, self.direction)

    @property
    def score(self) -> float:
        return self.q + self.bonus + self.knob.prior + self.jitter + self.feedback

    def blocked(self, value: Any) -> bool:
        """A value at or beyond one that crashed in this direction."""
        v = order_key(self.knob, value)
        for crashed in self.crashes:
            c = order_key(self.knob, crashed)
            if v is not None and c is not None and self.direction * (v - c) >= 0:
                return True
        return False

    def sizes(self) -> list[str]:
        """Step sizes in order of preference, from this arm's last outcome."""
        last = self.outcomes[-1] if self.outcomes else None
        if last is not None and last.reward > 0:
            return ["big", "normal", "small"]
        if last is not None and last.reward < 0:
            return ["small", "normal", "big"]
        return ["normal", "small", "big"]

    def candidates(self) -> list[tuple[str, Any]]:
        out, seen = [], set()
        for size in self.sizes():
            v = step_value(self.knob, self.const.value, self.direction, SIZES[size])
            if v is None or v in seen or self.blocked(v):
                continue
            seen.add(v)
            out.append((size, v))
        return out


def outcome_reward(entry: HistoryEntry) -> float | None:
    """An experiment's verdict as a reward: keep +1, a discard that hurt -1 (that improved without
    being kept +0.25), a crash or a rejection -1, still running 0 (tried, no verdict); None for anything else."""
    if entry.status == "keep":
        return 1.0
    if entry.status == "discard":
        if entry.delta is None:
            return -0.5
        return -1.0 if entry.delta > 0 else 0.25  # improved, but not by enough to keep
    if entry.status in NO_NUMBER:
        return -1.0
    if entry.status == "running":
        return 0.0  # counts as tried, no verdict yet
    return None


def _direction_of(knob: Knob, change: dict[str, Any]) -> int | None:
    d = change.get("direction")
    if d in (1, -1):
        return int(d)
    a, b = order_key(knob, change.get("old")), order_key(knob, change.get("new"))
    if a is None or b is None or a == b:
        return None
    return 1 if b > a else -1


def _changes(entry: HistoryEntry) -> list[dict[str, Any]]:
    changes = (entry.meta or {}).get("changes") if isinstance(entry.meta, dict) else None
    if not isinstance(changes, list):
        return []
    return [c for c in changes if isinstance(c, dict) and isinstance(c.get("name"), str)]


def learn(
    arms: dict[tuple[str, int], Arm],
    history: list[HistoryEntry],
    skeleton: str,
    table: Mapping[str, Knob] = KNOB_BY_NAME,
) -> int:
    """Attach every earlier outcome to its arms (knobs of `table`, the asset's) and score them;
    returns the number of trials."""
    total = len(history)
    trials = 0
    for i, entry in enumerate(history):
        reward = outcome_reward(entry)
        changes = _changes(entry)
        if reward is None or not changes:
            continue
        combined = len(changes) > 1
        age = total - 1 - i  # experiments since this one
        weight = RECENCY_DECAY**age / len(changes)
        crash = crash_state(entry, age, skeleton) if entry.status in NO_NUMBER else ""
        for ch in changes:
            knob = table.get(ch["name"])
            if knob is None:
                continue
            d = _direction_of(knob, ch)
            if d is None:
                continue
            trials += 1
            r = reward if not (combined and entry.status in NO_NUMBER) else -0.5
            if crash == "other code":
                r = 0.0  # tried, but on code that no longer exists
            out = Outcome(entry, ch.get("old"), ch.get("new"), d, r, weight, combined, crash)
            arm, other = arms.get((knob.name, d)), arms.get((knob.name, -d))
            if arm is not None:
                arm.outcomes.append(out)
                if crash == "blocking" and not combined:
                    arm.crashes.append(ch.get("new"))
            if other is not None and entry.status in ("keep", "discard", *NO_NUMBER):
                other.mirrored.append(out)  # a crash (or rejection) is told, not scored
    for arm in arms.values():
        mirrored = [o for o in arm.mirrored if o.entry.status not in NO_NUMBER]
        ev = sum(o.weight * o.reward for o in arm.outcomes)
        ev += sum(OPPOSITE_WEIGHT * o.weight * -o.reward for o in mirrored)
        cnt = sum(o.weight for o in arm.outcomes) + sum(OPPOSITE_WEIGHT * o.weight for o in mirrored)
        arm.q = ev / (cnt + 1.0)
        arm.bonus = EXPLORATION * math.sqrt(math.log(trials + 1) / (len(arm.outcomes) + 1))
    return trials
