"""Crash blocking: how long a crash keeps the explorer away from the value that crashed.

A crash can come from a bug that is fixed later (train.py once crashed at any model width that was
not a whole number of heads), so a crash blocks its value and beyond only while train.py's
`skeleton` (its code with the tuned values blanked out) is the one that crashed, and for at most
``CRASH_MEMORY`` later experiments.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.agent.constants import apply_edits, find_constants
from bot.agent.knobs import KNOB_BY_NAME, Knob
from bot.core.records import HistoryEntry, code_hash

CRASH_MEMORY = 20  # later experiments for which a crash keeps blocking its value and beyond


def crash_state(entry: HistoryEntry, age: int, skeleton: str) -> str:
    """Whether a crash still blocks its value: only on the same skeleton, and only for a while."""
    crashed_on = (entry.meta or {}).get("skeleton") if isinstance(entry.meta, dict) else None
    if crashed_on and crashed_on != skeleton:
        return "other code"  # the code around the constants changed since: perhaps the cause is gone
    return "blocking" if age < CRASH_MEMORY else "expired"


def skeleton(text: str, table: Mapping[str, Knob] = KNOB_BY_NAME) -> str:
    """The asset with the values of every tunable constant of `table` blanked out, hashed: what
    stays the same while the explorer only moves constants, and changes when the code itself is
    edited."""
    consts = find_constants(text)
    return code_hash(apply_edits(text, [(c, "_") for name, c in consts.items() if name in table]))[:16]
