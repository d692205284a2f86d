"""The causality probe: a language model's logits at position t may depend on tokens 0..t only.

A model that peeks at later tokens (or at the other rows of its batch, which are the next
stretches of the same text) would score a val_bpb it never learned. Before scoring, the harness
calls the model on a real validation batch and on copies where
- in each row, every token after that row's own cut position t is replaced by real text from
  another row (the cuts spread from an eighth of the way in to the last position but one), and
- every row but the first is replaced by another row,
and requires the logits that may not depend on the change to stay the same. Four calls in all:
the batch twice (the model's own jitter), then the two copies. The same input gives the same
logits on the CPU and on a GPU with fixed shapes, so the tolerance is tight: 1e-4 of the logits'
scale, or four times what calling the model twice on one batch already varies by (at most 1e-2
of the scale), if the hardware is less exact than that. A leak under it is worth under a thousandth of a bit per byte,
well inside any noise margin. Real text, not random tokens, goes in the replaced places, so that a
model cannot tell the probe from the evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class ProbeResult:
    causal: bool
    detail: str  # where it failed, or what was checked
    max_change: float  # the largest change seen in logits that had to stay the same


def tolerance(reference: torch.Tensor, again: torch.Tensor) -> float:
    """What may change between two calls that must agree: a tight bound above the model's own jitter."""
    jitter = float((again - reference).abs().max())
    scale = 1.0 + float(reference.abs().max())
    return max(1e-4 * scale, min(4.0 * jitter, 1e-2 * scale))  # random operators are refused before (handoff)


@torch.no_grad()
def causality_probe(forward: Callable[[torch.Tensor], torch.Tensor], batch: torch.Tensor) -> ProbeResult:
    """`forward(batch) -> logits [B, T, V]`; `batch` [B, T] of real tokens with B >= 2."""
    rows, length = batch.shape
    if rows < 2 or length < 4:
        raise ValueError(f"the probe needs at least 2 rows of 4 tokens, got {tuple(batch.shape)}")
    # Each row's replacement text: another row's, shifted along the sequence too, so that a token
    # sitting at the same place in both rows (each row's first token, say) still changes.
    other = batch.roll(1, dims=0).roll(length // 3, dims=1)
    base = forward(batch).float()
    limit = tolerance(base, forward(batch).float())
    # Each row is cut at its own position, spread from an eighth of the way in to the last but one,
    # so one call tests as many cut points as the batch has rows.
    first, last = length // 8, length - 2
    cuts = [first + (row * (last - first)) // max(1, rows - 1) for row in range(rows)]
    changed = batch.clone()
    for row, t in enumerate(cuts):
        changed[row, t + 1 :] = other[row, t + 1 :]
    logits = forward(changed).float()
    worst = 0.0
    for row, t in enumerate(cuts):
        change = float((logits[row, : t + 1] - base[row, : t + 1]).abs().max())
        worst = max(worst, change)
        if change > limit:
            return ProbeResult(
                False,
                f"the logits at positions 0..{t} changed by {change:.3g} (more than "
                f"{limit:.2g}) when only the tokens after position {t} changed: the model "
                "reads future tokens",
                worst,
            )
    changed = batch.clone()
    changed[1:] = other[1:]
    change = float((forward(changed).float()[0] - base[0]).abs().max())
    worst = max(worst, change)
    if change > limit:
        return ProbeResult(
            False,
            f"the logits of one row changed by {change:.3g} (more than {limit:.2g}) when "
            "only the other rows of the batch changed: the model reads across the batch, "
            "where the other rows hold the text that follows",
            worst,
        )
    return ProbeResult(
        True, f"causal: logits unchanged (within {limit:.2g}) under changes to later tokens and to other rows", worst
    )
