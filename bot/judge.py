"""The judge: keep, discard, confirm or re-measure, from numbers alone.

Noise is estimated from repeated runs of the same train.py (the baseline runs of main, and any
confirmation runs): the pooled standard deviation `sigma`. A candidate is kept only when its mean
val_bpb beats main's mean by more than the margin

    margin = max(min_margin, noise_sigmas * sigma * sqrt(1/n_candidate + 1/n_main))

(the standard error of the difference of two means, times a safety factor). A result that
improves on main but stays inside the margin (or while the noise is still unknown) gets one
confirmation run; a result measured on an older main is re-measured on the current one before it
may merge. Ties go to main.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class JudgeConfig:
    noise_sigmas: float = 2.0  # how many standard errors an improvement must clear
    min_margin: float = 0.0  # absolute floor on the margin, in val_bpb
    confirm: bool = True  # give a borderline improvement one confirmation run


@dataclass(frozen=True)
class Decision:
    action: str  # keep | discard | crash | confirm | remeasure | wait
    reason: str
    val_bpb: float | None = None
    delta: float | None = None
    margin: float | None = None


def pooled_sigma(groups: list[list[float]]) -> float | None:
    """Pooled standard deviation over groups of repeated measurements (None if no repeats)."""
    squares = 0.0
    dof = 0
    for values in groups:
        if len(values) >= 2:
            mean = statistics.fmean(values)
            squares += sum((v - mean) ** 2 for v in values)
            dof += len(values) - 1
    return math.sqrt(squares / dof) if dof else None


def margin(sigma: float | None, n_candidate: int, n_main: int, config: JudgeConfig) -> float:
    if sigma is None or n_candidate == 0 or n_main == 0:
        return config.min_margin
    return max(config.min_margin, config.noise_sigmas * sigma * math.sqrt(1 / n_candidate + 1 / n_main))


def decide(*, candidate: list[float], crash: str | None, main: list[float], sigma: float | None,
           measured_on: str, current_main: str, config: JudgeConfig) -> Decision:
    """Judge one experiment from its runs on `measured_on` against main's runs."""
    if crash is not None:
        return Decision("crash", f"the run crashed: {crash.strip().splitlines()[-1] if crash.strip() else 'no output'}")
    if measured_on != current_main:
        return Decision("remeasure", f"measured on main {measured_on[:7]}, but main is now "
                        f"{current_main[:7]}: re-measure on the current main before it may merge")
    if not candidate:
        return Decision("wait", "no finished run yet")
    if not main:
        return Decision("wait", "main has no measurement yet")
    value = statistics.fmean(candidate)
    base = statistics.fmean(main)
    delta = value - base
    band = margin(sigma, len(candidate), len(main), config)
    numbers = dict(val_bpb=value, delta=delta, margin=band)
    runs = f"{len(candidate)} run{'s' if len(candidate) > 1 else ''}"
    unknown_noise = sigma is None and band == 0.0
    if delta < 0 and unknown_noise and len(candidate) < 2 and config.confirm:
        return Decision("confirm", f"val_bpb {value:.6f} improves on main {base:.6f} by {-delta:.6f}, but the "
                        "noise is not known yet (no repeated runs): one confirmation run", **numbers)
    if delta < -band:
        return Decision("keep", f"val_bpb {value:.6f} beats main {base:.6f} by {-delta:.6f}, more than "
                        f"the noise margin {band:.6f} ({runs})", **numbers)
    if delta < 0 and len(candidate) < 2 and config.confirm:
        return Decision("confirm", f"val_bpb {value:.6f} improves on main {base:.6f} by {-delta:.6f}, "
                        f"inside the noise margin {band:.6f}: one confirmation run", **numbers)
    if delta < 0:
        return Decision("discard", f"val_bpb {value:.6f} improves on main {base:.6f} by only {-delta:.6f}, "
                        f"inside the noise margin {band:.6f} ({runs}): not a measurable gain", **numbers)
    if delta == 0:
        return Decision("discard", f"val_bpb {value:.6f} ties main: main keeps the tie", **numbers)
    return Decision("discard", f"val_bpb {value:.6f} is worse than main {base:.6f} by {delta:.6f}", **numbers)
