"""Keeping the batch whole: the batch-size divisibility rules per profile.

train.py fails at once unless its live ``TOTAL_BATCH_SIZE`` is a positive multiple of
``DEVICE_BATCH_SIZE * seq_len``, with seq_len from the profile. `batch_splits` checks that rule;
`batch_followers` moves the micro-batch down with a total batch lowered below one forward pass, so
smaller batches stay reachable.
"""

from __future__ import annotations

from typing import Any

from bot.agent.constants import Constant
from bot.agent.knobs import KNOB_BY_NAME, Knob, in_bounds, usable
from runner.profiles import get_profile


def profile_seq_len(profile: str) -> int | None:
    """Tokens per sequence on the profile, or None for a profile this explorer does not know."""
    try:
        return get_profile(profile).seq_len
    except ValueError:
        return None


def batch_names(device_kind: str) -> tuple[str, str]:
    """The live total-batch and micro-batch constants on this device kind."""
    prefix = "CPU_" if device_kind == "cpu" else ""
    return f"{prefix}TOTAL_BATCH_SIZE", f"{prefix}DEVICE_BATCH_SIZE"


def batch_splits(values: dict[str, Any], device_kind: str, seq_len: int | None) -> bool:
    """Whether the live TOTAL_BATCH_SIZE is a positive multiple of DEVICE_BATCH_SIZE * seq_len, as
    train.py demands. True when a constant is missing or the profile is unknown: nothing to check."""
    total_name, device_name = batch_names(device_kind)
    total, device = values.get(total_name), values.get(device_name)
    if seq_len is None or not isinstance(total, (int, float)) or not isinstance(device, (int, float)):
        return True
    per_pass = device * seq_len
    return per_pass > 0 and total >= per_pass and total % per_pass == 0


def batch_followers(
    knob: Knob, new: Any, consts: dict[str, Constant], device_kind: str, seq_len: int | None
) -> list[tuple[Constant, Knob, int]]:
    """The micro-batch that must move with a new total batch: lowering TOTAL_BATCH_SIZE below one
    forward pass of DEVICE_BATCH_SIZE sequences takes DEVICE_BATCH_SIZE down to the whole batch."""
    total_name, device_name = batch_names(device_kind)
    device = consts.get(device_name)
    device_knob = KNOB_BY_NAME[device_name]
    if knob.name != total_name or device is None or seq_len is None or not usable(device_knob, device.value):
        return []
    if not isinstance(new, int) or new <= 0 or new % seq_len or new >= device.value * seq_len:
        return []
    sequences = new // seq_len
    return [(device, device_knob, sequences)] if in_bounds(device_knob, sequences) else []
