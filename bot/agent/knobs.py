"""The tables of knobs: every constant of a task's asset the explorer may tune, and how a value steps.

A `Knob` names one module-level constant, how it moves (log-scale float, linear ratio, beta, int,
power of two, multiple of 16, choice, a flag that is on or off), its bounds, and why raising or
lowering it might improve the task's metric. `KNOBS` is train.py's table (training),
`ROUTER_KNOBS` router.py's (ticket-routing); `TASK_KNOBS` maps a task to its table, and a task
missing there has no constants to tune. `step_value` moves a value one step within those bounds;
`live` says which knobs apply on a device kind (the ``CPU_*`` size constants on "cpu", the GPU ones
on "cuda", the rest on both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

LOG, LINEAR, BETA, INT, POW2, MULT, CHOICE, FLAG = "log", "linear", "beta", "int", "pow2", "mult", "choice", "flag"
GPU, CPU, SHARED = "gpu", "cpu", "shared"


@dataclass(frozen=True)
class Knob:
    """One tunable constant of an asset: how it moves, within which bounds, and why it might help."""

    name: str
    kind: str  # log | linear | beta | int | pow2 | mult | choice | flag (a bool: +1 turns it on, -1 off)
    lo: float = 0.0
    hi: float = 0.0
    step: float = 1.0  # log: multiplicative factor; linear / mult: additive step; beta: factor on 1 - beta
    choices: tuple[str, ...] = ()  # choice: ordered; direction +1 moves to the next one
    scope: str = SHARED  # gpu | cpu | shared
    zero_ok: bool = False  # log: 0 is a legal value (lowering below lo gives 0, raising 0 gives lo)
    prior: float = 0.0  # small head start among untried arms
    what: str = ""
    up: str = ""  # why raising it (turning a flag on) might improve the metric
    down: str = ""  # why lowering it (turning a flag off) might improve the metric


_LR_UP = "a higher learning rate makes faster progress within the short, fixed training budget"
_LR_DOWN = "a lower learning rate trains more stably and may reach a lower loss with less noise"


def _shape_knobs(
    prefix: str, scope: str, depth_hi: int, head_lo: int, head_hi: int, total_lo: int, total_hi: int, dev_hi: int
) -> list[Knob]:
    return [
        Knob(
            f"{prefix}DEPTH",
            INT,
            1,
            depth_hi,
            scope=scope,
            prior=0.03,
            what="the number of transformer layers",
            up="a deeper model has more capacity per token, which pays off if the budget still allows enough steps",
            down="a shallower model is faster per step, so the fixed time budget buys more optimizer steps and tokens",
        ),
        Knob(
            f"{prefix}ASPECT_RATIO",
            MULT,
            32,
            128,
            step=16,
            scope=scope,
            prior=0.02,
            what="the model width per layer (model_dim = depth x aspect ratio, rounded up to whole heads)",
            up="a wider model has more capacity per layer and keeps the matrix units busier",
            down="a narrower model is cheaper per step and sees more tokens in the fixed time budget",
        ),
        Knob(
            f"{prefix}HEAD_DIM",
            POW2,
            head_lo,
            head_hi,
            scope=scope,
            prior=0.01,
            what="the attention head size",
            up="fewer, larger heads are cheaper to run and give each head more room",
            down="more, smaller heads let attention track more patterns at once",
        ),
        Knob(
            f"{prefix}TOTAL_BATCH_SIZE",
            POW2,
            total_lo,
            total_hi,
            scope=scope,
            prior=0.02,
            what="the number of tokens per optimizer step",
            up="a larger batch gives less noisy gradients and tolerates higher learning rates",
            down="a smaller batch means more optimizer steps in the same time, which often wins in short runs",
        ),
        Knob(
            f"{prefix}DEVICE_BATCH_SIZE",
            POW2,
            1,
            dev_hi,
            scope=scope,
            prior=0.0,
            what="the number of sequences per forward pass (gradient accumulation covers the rest)",
            up="a bigger micro-batch uses the hardware better and cuts gradient-accumulation overhead",
            down="a smaller micro-batch lowers peak memory and, when it is the bottleneck, speeds each step up",
        ),
    ]


KNOBS: tuple[Knob, ...] = tuple(
    _shape_knobs("", GPU, depth_hi=24, head_lo=32, head_hi=256, total_lo=2**14, total_hi=2**22, dev_hi=512)
    + _shape_knobs("CPU_", CPU, depth_hi=8, head_lo=8, head_hi=128, total_lo=2**9, total_hi=2**16, dev_hi=128)
    + [
        Knob(
            "WINDOW_PATTERN",
            CHOICE,
            choices=("L", "SL", "SSL", "SSSL", "SSSSL"),
            prior=0.02,
            what="the per-layer attention window pattern (S = half context, L = full context)",
            up="more short-window layers make attention cheaper, buying more steps in the time budget",
            down="more full-context layers let the model use longer-range context",
        ),
        Knob(
            "LOGIT_SOFTCAP",
            LINEAR,
            5.0,
            50.0,
            step=2.5,
            prior=0.01,
            what="the tanh cap on the output logits",
            up="a looser cap lets the model make more confident predictions",
            down="a tighter cap regularizes the logits and can stabilize early training",
        ),
        Knob(
            "EMBEDDING_LR",
            LOG,
            0.01,
            5.0,
            step=1.5,
            prior=0.04,
            what="the learning rate of the token embeddings",
            up=_LR_UP,
            down=_LR_DOWN,
        ),
        Knob(
            "UNEMBEDDING_LR",
            LOG,
            1e-4,
            0.1,
            step=1.5,
            prior=0.04,
            what="the learning rate of the output (unembedding) layer",
            up=_LR_UP,
            down=_LR_DOWN,
        ),
        Knob(
            "MATRIX_LR",
            LOG,
            1e-3,
            0.5,
            step=1.5,
            prior=0.05,
            what="the Muon learning rate of the transformer's weight matrices",
            up=_LR_UP,
            down=_LR_DOWN,
        ),
        Knob(
            "SCALAR_LR",
            LOG,
            0.01,
            5.0,
            step=1.5,
            prior=0.03,
            what="the learning rate of the scalar (gain and mixing) parameters",
            up=_LR_UP,
            down=_LR_DOWN,
        ),
        Knob(
            "WEIGHT_DECAY",
            LOG,
            0.01,
            1.0,
            step=1.5,
            zero_ok=True,
            prior=0.03,
            what="the weight decay",
            up="stronger weight decay regularizes and keeps the weights in a better-conditioned range",
            down="weaker weight decay lets the short run fit the data faster",
        ),
        Knob(
            "ADAM_BETA1",
            BETA,
            0.5,
            0.99,
            step=1.5,
            prior=0.01,
            what="AdamW's momentum coefficient",
            up="more momentum smooths noisy gradients",
            down="less momentum reacts faster, which can help in a short run",
        ),
        Knob(
            "ADAM_BETA2",
            BETA,
            0.8,
            0.999,
            step=1.5,
            prior=0.01,
            what="AdamW's second-moment decay",
            up="a longer second-moment average gives steadier step sizes",
            down="a shorter second-moment average adapts faster to changing gradient scales",
        ),
        Knob(
            "MUON_MOMENTUM",
            BETA,
            0.8,
            0.99,
            step=1.5,
            prior=0.02,
            what="the Muon optimizer's momentum",
            up="more momentum averages out gradient noise across steps",
            down="less momentum follows the current gradient more closely, which can help in a short run",
        ),
        Knob(
            "MUON_BETA2",
            BETA,
            0.8,
            0.999,
            step=1.5,
            prior=0.01,
            what="the decay of the per-neuron mean square that NorMuon divides Muon's update by",
            up="a longer average gives each neuron a steadier step size",
            down="a shorter average adapts each neuron's step size faster to its changing gradients",
        ),
        Knob(
            "WARMUP_RATIO",
            LINEAR,
            0.0,
            0.3,
            step=0.05,
            prior=0.02,
            what="the fraction of the run spent warming up the learning rate",
            up="a short warmup stabilizes the first steps at high learning rates",
            down="less warmup spends more of the short budget at the full learning rate",
        ),
        Knob(
            "WARMDOWN_RATIO",
            LINEAR,
            0.0,
            0.9,
            step=0.1,
            prior=0.04,
            what="the fraction of the run spent decaying the learning rate at the end",
            up="a longer warmdown anneals for longer, which usually lowers the final loss",
            down="a shorter warmdown keeps the learning rate high for longer and makes more progress before annealing",
        ),
        Knob(
            "FINAL_LR_FRAC",
            LINEAR,
            0.0,
            0.5,
            step=0.05,
            prior=0.02,
            what="the learning rate at the end of the warmdown, as a fraction of the peak",
            up="a higher floor keeps the model learning until the very end",
            down="annealing closer to zero settles the weights into a lower-loss minimum",
        ),
    ]
)
KNOB_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}

# router.py's knobs (runner/tasks/ticket_routing/router.py: constants at the top of a naive Bayes router)
ROUTER_KNOBS: tuple[Knob, ...] = (
    Knob(
        "ALPHA",
        LOG,
        0.01,
        10.0,
        step=2.0,
        prior=0.04,
        what="the additive smoothing of word counts per queue",
        up="more smoothing trusts words seen only a few times less, so one rare word cannot decide a ticket",
        down="less smoothing lets the words that mark a queue count fully",
    ),
    Knob(
        "BIGRAMS",
        FLAG,
        prior=0.03,
        what="whether pairs of adjacent words are counted as features too",
        up="pairs such as 'card arrived' or 'not received' tell apart neighbouring queues that share their words",
        down="single words alone give denser counts, which a small training split estimates better",
    ),
    Knob(
        "MIN_WORD_LENGTH",
        INT,
        1,
        6,
        prior=0.02,
        what="the shortest word counted",
        up="dropping very short words removes noise that every queue shares",
        down="keeping short words keeps short signals such as 'pin', 'atm' or 'fee'",
    ),
    Knob(
        "PRIOR",
        FLAG,
        prior=0.01,
        what="whether each queue is weighed by its share of the training tickets",
        up="the prior favours common queues, which is right more often when a ticket's words are ambiguous",
        down="without the prior, rare queues are not drowned out by common ones",
    ),
    Knob(
        "LOWERCASE",
        FLAG,
        prior=0.0,
        what="whether words are folded to lower case before counting",
        up="folding case counts 'Card' and 'card' as one word, so each word is seen more often",
        down="keeping case tells apart words whose capitals carry meaning",
    ),
)
TASK_KNOBS: dict[str, tuple[Knob, ...]] = {"training": KNOBS, "ticket-routing": ROUTER_KNOBS}


def knob_table(task: str) -> dict[str, Knob]:
    """The knobs of the task's asset by name ({} for a task without tunable constants)."""
    return {k.name: k for k in TASK_KNOBS.get(task, ())}


def live(knob: Knob, device_kind: str) -> bool:
    """Whether the knob applies on this device kind."""
    if knob.scope == SHARED:
        return True
    if knob.scope == CPU:
        return device_kind == "cpu"
    return device_kind == "cuda"


# ---------------------------------------------------------------------------------------------
# Moving one knob
# ---------------------------------------------------------------------------------------------


def _round_sig(x: float, digits: int) -> float:
    if x == 0:
        return 0.0
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def in_bounds(knob: Knob, v: Any) -> bool:
    """Whether v lies within the knob's bounds (a listed choice; 0 where zero_ok; a flag's two values)."""
    if knob.kind == CHOICE:
        return v in knob.choices
    if knob.kind == FLAG:
        return isinstance(v, bool)
    return knob.lo <= v <= knob.hi or (knob.zero_ok and v == 0)


def _distance(knob: Knob, v: float) -> float:
    if in_bounds(knob, v):
        return 0.0
    return knob.lo - v if v < knob.lo else v - knob.hi


def order_key(knob: Knob, v: Any) -> float | None:
    """A number that grows in the knob's +1 direction (the index for choices), or None."""
    if knob.kind == CHOICE:
        return float(knob.choices.index(v)) if v in knob.choices else None
    if knob.kind == FLAG:
        return float(v) if isinstance(v, bool) else None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def usable(knob: Knob, value: Any) -> bool:
    """Whether the asset's value is one this knob can step from (a listed choice, a positive integer...)."""
    if knob.kind == CHOICE:
        return isinstance(value, str) and value in knob.choices
    if knob.kind == FLAG:
        return isinstance(value, bool)
    if isinstance(value, str) or isinstance(value, bool):
        return False
    if knob.kind in (INT, POW2, MULT):
        return float(value).is_integer() and value > 0
    if knob.kind == LOG:
        return value > 0 or (value == 0 and knob.zero_ok)
    if knob.kind == BETA:
        return 0 <= value < 1
    return True


def step_value(knob: Knob, old: Any, direction: int, size: float) -> Any | None:
    """The value one step of `size` (0.5 small, 1 normal, 1.5 big) away in `direction`, or None.

    Continuous kinds scale their step by `size`; discrete kinds move one notch, or two for a big
    step (powers of two always move one notch: halving or doubling is already a big change); a
    flag turns on (+1) or off (-1) whatever the size.
    """
    d = direction
    if knob.kind == FLAG:
        return (d > 0) if old is (d < 0) else None
    k = 1 if size <= 1 else 2
    if knob.kind == CHOICE:
        i = knob.choices.index(old)
        j = min(max(i + d * k, 0), len(knob.choices) - 1)
        return knob.choices[j] if j != i else None
    if knob.kind == INT:
        new: Any = int(old) + d * k
    elif knob.kind == POW2:
        old_i = int(old)
        if d > 0:
            new = old_i * 2
        elif old_i % 2 == 0:
            new = old_i // 2
        else:
            return None
    elif knob.kind == MULT:
        s, old_i = int(knob.step), int(old)
        base = (old_i // s) * s if d > 0 else -((-old_i) // s) * s
        new = base + d * s * k
    elif knob.kind == LOG:
        if old == 0:
            new = knob.lo if d > 0 else None
            if new is None:
                return None
        else:
            new = _round_sig(old * knob.step ** (d * size), 2)
            if new < knob.lo and knob.zero_ok and d < 0:
                new = 0.0 if old <= knob.lo else knob.lo
    elif knob.kind == LINEAR:
        new = round(old + d * knob.step * size, 4)
    elif knob.kind == BETA:
        gap = _round_sig((1 - old) / knob.step ** (d * size), 2)
        new = round(1 - gap, 6)
    else:  # pragma: no cover - table typo
        raise ValueError(f"unknown knob kind {knob.kind}")
    # Clamp a step that overshoots the bounds, when the old value was inside them.
    if knob.kind != CHOICE and in_bounds(knob, old) and not in_bounds(knob, new):
        if knob.kind == POW2:
            return None
        new = knob.hi if new > knob.hi else knob.lo
    if new == old:
        return None
    if not in_bounds(knob, new) and _distance(knob, new) >= _distance(knob, old):
        return None
    if isinstance(old, int) and knob.kind in (INT, POW2, MULT):
        new = int(new)
    return new
