"""The offline explorer: a small, explainable bandit search over train.py's hyperparameter block.

No network and no model: it edits the module-level constants of train.py (``MATRIX_LR = 0.04``,
``DEPTH = 8`` ...) one at a time and learns from the outcomes of its own earlier edits.

How it works
------------
* ``KNOBS`` lists every constant it may tune, with a kind (log-scale float, linear ratio, beta,
  int, power of two, multiple of 16, choice) and bounds. Only names that exist in train.py are
  tuned, and only the size constants that are live on ``ctx.device_kind`` (``CPU_*`` on "cpu",
  the GPU ones on "cuda"); attention and optimizer constants are shared.
* Every (constant, direction) pair is an arm of a UCB bandit. Each earlier experiment whose
  ``meta["changes"]`` names the arm is an outcome: keep +1, discard that hurt -1, discard that
  improved but not enough to keep +0.25, crash -1. Outcomes of the opposite direction count half,
  mirrored (lowering hurt -> raising looks promising). Recent outcomes weigh more. The score is
  ``mean + C * sqrt(ln(N + 1) / (n + 1))`` plus a small per-knob prior and a seeded jitter, so
  untried arms get explored and arms that helped get pushed further.
* A crash blocks the crashed value and anything beyond it in that direction, but not forever: a
  crash can come from a bug that is fixed later (train.py once crashed at any model width that was
  not a whole number of heads). The block holds while the code around the constants is the code
  that crashed (each proposal records a hash of train.py with the tuned values blanked out, its
  "skeleton") and for at most ``CRASH_MEMORY`` later experiments; after that the value may be
  tried once more, and a new crash blocks it again. A crash on a different skeleton says nothing
  about today's code and is not scored at all.
* The batch must split into whole forward passes: ``TOTAL_BATCH_SIZE`` a positive multiple of
  ``DEVICE_BATCH_SIZE * seq_len``, with seq_len from ``ctx.profile`` (train.py fails at once
  otherwise). No proposal breaks that. Lowering the total batch below one pass of the current
  micro-batch takes the micro-batch down with it, in the same proposal, so smaller batches stay
  reachable.
* The step size follows the arm's last outcome: after a keep a bigger step in the same direction,
  after a discard a smaller one, otherwise the normal step.
* Human feedback naming a constant ("try a lower matrix_lr") gives that arm a large bonus until
  an experiment has followed that comment.
* Mostly one change per proposal; during a losing streak it occasionally combines the two best
  arms that helped earlier.
* Proposals whose code_hash was already seen (or equals main) are skipped in favour of the next
  candidate; when nothing is left it raises ``AgentError("explorer exhausted: ...")``.
"""

from __future__ import annotations

import ast
import hashlib
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

from bot.agent import AgentError
from bot.records import HistoryEntry, Proposal, ProposalContext, code_hash
from runner.profiles import get_profile

# ---------------------------------------------------------------------------------------------
# The table of knobs
# ---------------------------------------------------------------------------------------------

LOG, LINEAR, BETA, INT, POW2, MULT, CHOICE = "log", "linear", "beta", "int", "pow2", "mult", "choice"
GPU, CPU, SHARED = "gpu", "cpu", "shared"


@dataclass(frozen=True)
class Knob:
    """One tunable constant of train.py: how it moves, within which bounds, and why it might help."""

    name: str
    kind: str  # log | linear | beta | int | pow2 | mult | choice
    lo: float = 0.0
    hi: float = 0.0
    step: float = 1.0  # log: multiplicative factor; linear / mult: additive step; beta: factor on 1 - beta
    choices: tuple[str, ...] = ()  # choice: ordered; direction +1 moves to the next one
    scope: str = SHARED  # gpu | cpu | shared
    zero_ok: bool = False  # log: 0 is a legal value (lowering below lo gives 0, raising 0 gives lo)
    prior: float = 0.0  # small head start among untried arms
    what: str = ""
    up: str = ""  # why raising it might lower val_bpb
    down: str = ""  # why lowering it might lower val_bpb


_LR_UP = "a higher learning rate makes faster progress within the short, fixed training budget"
_LR_DOWN = "a lower learning rate trains more stably and may reach a lower loss with less noise"


def _shape_knobs(prefix: str, scope: str, depth_hi: int, head_lo: int, head_hi: int,
                 total_lo: int, total_hi: int, dev_hi: int) -> list[Knob]:
    return [
        Knob(f"{prefix}DEPTH", INT, 1, depth_hi, scope=scope, prior=0.03,
             what="the number of transformer layers",
             up="a deeper model has more capacity per token, which pays off if the budget still allows enough steps",
             down="a shallower model is faster per step, so the fixed time budget buys more optimizer steps and tokens"),
        Knob(f"{prefix}ASPECT_RATIO", MULT, 32, 128, step=16, scope=scope, prior=0.02,
             what="the model width per layer (model_dim = depth x aspect ratio, rounded up to whole heads)",
             up="a wider model has more capacity per layer and keeps the matrix units busier",
             down="a narrower model is cheaper per step and sees more tokens in the fixed time budget"),
        Knob(f"{prefix}HEAD_DIM", POW2, head_lo, head_hi, scope=scope, prior=0.01,
             what="the attention head size",
             up="fewer, larger heads are cheaper to run and give each head more room",
             down="more, smaller heads let attention track more patterns at once"),
        Knob(f"{prefix}TOTAL_BATCH_SIZE", POW2, total_lo, total_hi, scope=scope, prior=0.02,
             what="the number of tokens per optimizer step",
             up="a larger batch gives less noisy gradients and tolerates higher learning rates",
             down="a smaller batch means more optimizer steps in the same time, which often wins in short runs"),
        Knob(f"{prefix}DEVICE_BATCH_SIZE", POW2, 1, dev_hi, scope=scope, prior=0.0,
             what="the number of sequences per forward pass (gradient accumulation covers the rest)",
             up="a bigger micro-batch uses the hardware better and cuts gradient-accumulation overhead",
             down="a smaller micro-batch lowers peak memory and, when it is the bottleneck, speeds each step up"),
    ]


KNOBS: tuple[Knob, ...] = tuple(
    _shape_knobs("", GPU, depth_hi=24, head_lo=32, head_hi=256, total_lo=2**14, total_hi=2**22, dev_hi=512)
    + _shape_knobs("CPU_", CPU, depth_hi=8, head_lo=8, head_hi=128, total_lo=2**9, total_hi=2**16, dev_hi=128)
    + [
        Knob("WINDOW_PATTERN", CHOICE, choices=("L", "SL", "SSL", "SSSL", "SSSSL"), prior=0.02,
             what="the per-layer attention window pattern (S = half context, L = full context)",
             up="more short-window layers make attention cheaper, buying more steps in the time budget",
             down="more full-context layers let the model use longer-range context"),
        Knob("LOGIT_SOFTCAP", LINEAR, 5.0, 50.0, step=2.5, prior=0.01,
             what="the tanh cap on the output logits",
             up="a looser cap lets the model make more confident predictions",
             down="a tighter cap regularizes the logits and can stabilize early training"),
        Knob("EMBEDDING_LR", LOG, 0.01, 5.0, step=1.5, prior=0.04,
             what="the learning rate of the token embeddings", up=_LR_UP, down=_LR_DOWN),
        Knob("UNEMBEDDING_LR", LOG, 1e-4, 0.1, step=1.5, prior=0.04,
             what="the learning rate of the output (unembedding) layer", up=_LR_UP, down=_LR_DOWN),
        Knob("MATRIX_LR", LOG, 1e-3, 0.5, step=1.5, prior=0.05,
             what="the Muon learning rate of the transformer's weight matrices", up=_LR_UP, down=_LR_DOWN),
        Knob("SCALAR_LR", LOG, 0.01, 5.0, step=1.5, prior=0.03,
             what="the learning rate of the scalar (gain and mixing) parameters", up=_LR_UP, down=_LR_DOWN),
        Knob("WEIGHT_DECAY", LOG, 0.01, 1.0, step=1.5, zero_ok=True, prior=0.03,
             what="the weight decay",
             up="stronger weight decay regularizes and keeps the weights in a better-conditioned range",
             down="weaker weight decay lets the short run fit the data faster"),
        Knob("ADAM_BETA1", BETA, 0.5, 0.99, step=1.5, prior=0.01,
             what="AdamW's momentum coefficient",
             up="more momentum smooths noisy gradients",
             down="less momentum reacts faster, which can help in a short run"),
        Knob("ADAM_BETA2", BETA, 0.8, 0.999, step=1.5, prior=0.01,
             what="AdamW's second-moment decay",
             up="a longer second-moment average gives steadier step sizes",
             down="a shorter second-moment average adapts faster to changing gradient scales"),
        Knob("MUON_MOMENTUM", BETA, 0.8, 0.99, step=1.5, prior=0.02,
             what="the Muon optimizer's momentum",
             up="more momentum averages out gradient noise across steps",
             down="less momentum follows the current gradient more closely, which can help in a short run"),
        Knob("MUON_BETA2", BETA, 0.8, 0.999, step=1.5, prior=0.01,
             what="the decay of the per-neuron mean square that NorMuon divides Muon's update by",
             up="a longer average gives each neuron a steadier step size",
             down="a shorter average adapts each neuron's step size faster to its changing gradients"),
        Knob("WARMUP_RATIO", LINEAR, 0.0, 0.3, step=0.05, prior=0.02,
             what="the fraction of the run spent warming up the learning rate",
             up="a short warmup stabilizes the first steps at high learning rates",
             down="less warmup spends more of the short budget at the full learning rate"),
        Knob("WARMDOWN_RATIO", LINEAR, 0.0, 0.9, step=0.1, prior=0.04,
             what="the fraction of the run spent decaying the learning rate at the end",
             up="a longer warmdown anneals for longer, which usually lowers the final loss",
             down="a shorter warmdown keeps the learning rate high for longer and makes more progress before annealing"),
        Knob("FINAL_LR_FRAC", LINEAR, 0.0, 0.5, step=0.05, prior=0.02,
             what="the learning rate at the end of the warmdown, as a fraction of the peak",
             up="a higher floor keeps the model learning until the very end",
             down="annealing closer to zero settles the weights into a lower-loss minimum"),
    ]
)
KNOB_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}

# Search constants (see the module docstring).
EXPLORATION = 0.5  # C in the UCB bonus
OPPOSITE_WEIGHT = 0.5  # how much an outcome of the other direction counts, mirrored
RECENCY_DECAY = 0.97  # weight of an outcome per later experiment
JITTER = 0.1  # seeded noise added to every arm's score (tie-breaking among untried arms)
FEEDBACK_BONUS = 5.0  # a human comment naming an arm beats any learned score
COMBINE_AFTER = 4  # consecutive non-keeps before the first combined proposal...
COMBINE_EVERY = 3  # ...and then every this many
CRASH_MEMORY = 20  # later experiments for which a crash keeps blocking its value and beyond
SIZES = {"small": 0.5, "normal": 1.0, "big": 1.5}

_DOWN_WORDS = ("lower", "down", "decrease", "decreasing", "smaller", "reduce", "less", "shorter", "fewer",
               "narrower", "shallower", "drop", "halve", "cut")
_UP_WORDS = ("higher", "up", "increase", "increasing", "bigger", "larger", "raise", "more", "longer",
             "wider", "deeper", "double", "boost")
_NEGATIONS = ("don't", "dont", "do not", "stop", "avoid", "no more", "never")


# ---------------------------------------------------------------------------------------------
# Reading and editing the constants of train.py
# ---------------------------------------------------------------------------------------------


@dataclass
class Constant:
    """A module-level `NAME = literal` of train.py and where its value sits in the source."""

    name: str
    value: int | float | str
    lineno: int  # 1-based
    start: int  # character offsets of the value within its line
    end: int
    source: str  # the value as written
    pow2: bool  # written as 2**N


def _eval_literal(node: ast.AST) -> int | float | str:
    """Evaluate a literal, a signed literal or arithmetic on numeric literals (2**19, 3e-4 * 2)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, str):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_literal(node.operand)
        if isinstance(v, str):
            raise ValueError("sign on a string")
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.Mult, ast.Div, ast.Add, ast.Sub)):
        a, b = _eval_literal(node.left), _eval_literal(node.right)
        if isinstance(a, str) or isinstance(b, str):
            raise ValueError("arithmetic on a string")
        if isinstance(node.op, ast.Pow):
            if abs(b) > 64:
                raise ValueError("exponent too large")
            return a**b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.Div):
            return a / b
        return a + b if isinstance(node.op, ast.Add) else a - b
    raise ValueError(f"not a literal: {ast.dump(node)}")


def _is_pow2_expr(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Pow)
        and isinstance(node.left, ast.Constant)
        and node.left.value == 2
        and isinstance(node.right, ast.Constant)
        and type(node.right.value) is int
    )


def _char_offset(line: str, byte_offset: int) -> int:
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="replace"))


def find_constants(text: str) -> dict[str, Constant]:
    """All module-level constants of train.py, by name. Names assigned more than once are left out."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise AgentError(f"explorer cannot parse train.py: {exc}") from exc
    lines = text.splitlines(keepends=True)
    found: dict[str, Constant] = {}
    assigned: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.AugAssign):
            targets, value = [node.target], None
        else:
            continue
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    assigned[n.id] = assigned.get(n.id, 0) + 1
        if value is None or len(targets) != 1 or not isinstance(targets[0], ast.Name):
            continue
        if value.lineno != value.end_lineno:
            continue
        try:
            v = _eval_literal(value)
        except (ValueError, ZeroDivisionError, OverflowError, TypeError):
            continue
        line = lines[value.lineno - 1]
        start, end = _char_offset(line, value.col_offset), _char_offset(line, value.end_col_offset)
        found[targets[0].id] = Constant(
            name=targets[0].id, value=v, lineno=value.lineno, start=start, end=end,
            source=line[start:end], pow2=_is_pow2_expr(value),
        )
    return {name: c for name, c in found.items() if assigned.get(name) == 1}


def apply_edits(text: str, edits: list[tuple[Constant, str]]) -> str:
    """Replace exactly the source span of each constant's value; every other byte stays as it was."""
    lines = text.splitlines(keepends=True)
    for const, new_src in sorted(edits, key=lambda e: (e[0].lineno, e[0].start), reverse=True):
        line = lines[const.lineno - 1]
        lines[const.lineno - 1] = line[: const.start] + new_src + line[const.end :]
    return "".join(lines)


def _round_sig(x: float, digits: int) -> float:
    if x == 0:
        return 0.0
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def format_value(knob: Knob, const: Constant, new: int | float | str) -> str:
    """Python source for a new value, in the style the old one was written."""
    if isinstance(new, str):
        quote = const.source[0] if const.source[:1] in ("'", '"') else '"'
        return f"{quote}{new}{quote}"
    if knob.kind in (INT, POW2, MULT):
        n = int(new)
        if const.pow2 and n > 0 and n & (n - 1) == 0:
            return f"2**{n.bit_length() - 1}"
        return str(n)
    if isinstance(const.value, int) and float(new).is_integer():
        return str(int(new))
    return repr(float(new))


# ---------------------------------------------------------------------------------------------
# Moving one knob
# ---------------------------------------------------------------------------------------------


def _in_bounds(knob: Knob, v: Any) -> bool:
    if knob.kind == CHOICE:
        return v in knob.choices
    return knob.lo <= v <= knob.hi or (knob.zero_ok and v == 0)


def _distance(knob: Knob, v: float) -> float:
    if _in_bounds(knob, v):
        return 0.0
    return knob.lo - v if v < knob.lo else v - knob.hi


def _order_key(knob: Knob, v: Any) -> float | None:
    """A number that grows in the knob's +1 direction (the index for choices), or None."""
    if knob.kind == CHOICE:
        return float(knob.choices.index(v)) if v in knob.choices else None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def _usable(knob: Knob, value: Any) -> bool:
    if knob.kind == CHOICE:
        return isinstance(value, str) and value in knob.choices
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
    step (powers of two always move one notch: halving or doubling is already a big change).
    """
    d = direction
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
    if knob.kind != CHOICE and _in_bounds(knob, old) and not _in_bounds(knob, new):
        if knob.kind == POW2:
            return None
        new = knob.hi if new > knob.hi else knob.lo
    if new == old:
        return None
    if not _in_bounds(knob, new) and _distance(knob, new) >= _distance(knob, old):
        return None
    if isinstance(old, int) and knob.kind in (INT, POW2, MULT):
        new = int(new)
    return new


# ---------------------------------------------------------------------------------------------
# Learning from history
# ---------------------------------------------------------------------------------------------


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
        v = _order_key(self.knob, value)
        for crashed in self.crashes:
            c = _order_key(self.knob, crashed)
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


def _reward(entry: HistoryEntry) -> float | None:
    if entry.status == "keep":
        return 1.0
    if entry.status == "discard":
        if entry.delta is None:
            return -0.5
        return -1.0 if entry.delta > 0 else 0.25  # improved, but not by enough to keep
    if entry.status == "crash":
        return -1.0
    if entry.status == "running":
        return 0.0  # counts as tried, no verdict yet
    return None


def _direction_of(knob: Knob, change: dict[str, Any]) -> int | None:
    d = change.get("direction")
    if d in (1, -1):
        return int(d)
    a, b = _order_key(knob, change.get("old")), _order_key(knob, change.get("new"))
    if a is None or b is None or a == b:
        return None
    return 1 if b > a else -1


def _changes(entry: HistoryEntry) -> list[dict[str, Any]]:
    changes = (entry.meta or {}).get("changes") if isinstance(entry.meta, dict) else None
    if not isinstance(changes, list):
        return []
    return [c for c in changes if isinstance(c, dict) and isinstance(c.get("name"), str)]


def _crash_state(entry: HistoryEntry, age: int, skeleton: str) -> str:
    """Whether a crash still blocks its value: only on the same skeleton, and only for a while."""
    crashed_on = (entry.meta or {}).get("skeleton") if isinstance(entry.meta, dict) else None
    if crashed_on and crashed_on != skeleton:
        return "other code"  # the code around the constants changed since: perhaps the cause is gone
    return "blocking" if age < CRASH_MEMORY else "expired"


def _learn(arms: dict[tuple[str, int], Arm], history: list[HistoryEntry], skeleton: str) -> int:
    """Attach every earlier outcome to its arms and score them; returns the number of trials."""
    total = len(history)
    trials = 0
    for i, entry in enumerate(history):
        reward = _reward(entry)
        changes = _changes(entry)
        if reward is None or not changes:
            continue
        combined = len(changes) > 1
        age = total - 1 - i  # experiments since this one
        weight = RECENCY_DECAY ** age / len(changes)
        crash = _crash_state(entry, age, skeleton) if entry.status == "crash" else ""
        for ch in changes:
            knob = KNOB_BY_NAME.get(ch["name"])
            if knob is None:
                continue
            d = _direction_of(knob, ch)
            if d is None:
                continue
            trials += 1
            r = reward if not (combined and entry.status == "crash") else -0.5
            if crash == "other code":
                r = 0.0  # tried, but on code that no longer exists
            out = Outcome(entry, ch.get("old"), ch.get("new"), d, r, weight, combined, crash)
            arm, other = arms.get((knob.name, d)), arms.get((knob.name, -d))
            if arm is not None:
                arm.outcomes.append(out)
                if crash == "blocking" and not combined:
                    arm.crashes.append(ch.get("new"))
            if other is not None and entry.status in ("keep", "discard", "crash"):
                other.mirrored.append(out)  # a crash is told in the hypothesis, but not scored
    for arm in arms.values():
        mirrored = [o for o in arm.mirrored if o.entry.status != "crash"]
        ev = sum(o.weight * o.reward for o in arm.outcomes)
        ev += sum(OPPOSITE_WEIGHT * o.weight * -o.reward for o in mirrored)
        cnt = sum(o.weight for o in arm.outcomes) + sum(OPPOSITE_WEIGHT * o.weight for o in mirrored)
        arm.q = ev / (cnt + 1.0)
        arm.bonus = EXPLORATION * math.sqrt(math.log(trials + 1) / (len(arm.outcomes) + 1))
    return trials


def skeleton(text: str) -> str:
    """train.py with the values of every tunable constant blanked out, hashed: what stays the same
    while the explorer only moves constants, and changes when the code itself is edited."""
    consts = find_constants(text)
    return code_hash(apply_edits(text, [(c, "_") for name, c in consts.items() if name in KNOB_BY_NAME]))[:16]


# ---------------------------------------------------------------------------------------------
# Keeping the batch whole
# ---------------------------------------------------------------------------------------------


def _seq_len(profile: str) -> int | None:
    """Tokens per sequence on the profile, or None for a profile this explorer does not know."""
    try:
        return get_profile(profile).seq_len
    except ValueError:
        return None


def _batch_names(device_kind: str) -> tuple[str, str]:
    prefix = "CPU_" if device_kind == "cpu" else ""
    return f"{prefix}TOTAL_BATCH_SIZE", f"{prefix}DEVICE_BATCH_SIZE"


def batch_splits(values: dict[str, Any], device_kind: str, seq_len: int | None) -> bool:
    """Whether the live TOTAL_BATCH_SIZE is a positive multiple of DEVICE_BATCH_SIZE * seq_len, as
    train.py demands. True when a constant is missing or the profile is unknown: nothing to check."""
    total_name, device_name = _batch_names(device_kind)
    total, device = values.get(total_name), values.get(device_name)
    if seq_len is None or not isinstance(total, (int, float)) or not isinstance(device, (int, float)):
        return True
    per_pass = device * seq_len
    return per_pass > 0 and total >= per_pass and total % per_pass == 0


def _followers(knob: Knob, new: Any, consts: dict[str, Constant], device_kind: str,
               seq_len: int | None) -> list[tuple[Constant, Knob, int]]:
    """The micro-batch that must move with a new total batch: lowering TOTAL_BATCH_SIZE below one
    forward pass of DEVICE_BATCH_SIZE sequences takes DEVICE_BATCH_SIZE down to the whole batch."""
    total_name, device_name = _batch_names(device_kind)
    device = consts.get(device_name)
    device_knob = KNOB_BY_NAME[device_name]
    if knob.name != total_name or device is None or seq_len is None or not _usable(device_knob, device.value):
        return []
    if not isinstance(new, int) or new <= 0 or new % seq_len or new >= device.value * seq_len:
        return []
    sequences = new // seq_len
    return [(device, device_knob, sequences)] if _in_bounds(device_knob, sequences) else []


# ---------------------------------------------------------------------------------------------
# Human feedback
# ---------------------------------------------------------------------------------------------


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


def _apply_feedback(arms: dict[tuple[str, int], Arm], feedback: list[str], history: list[HistoryEntry]) -> None:
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
    # Longest names first, so "cpu_depth" is not read as "depth".
    names = sorted({k.name for k in KNOBS}, key=len, reverse=True)
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
                for direction in ((d,) if d else (1, -1)):
                    arm = arms[(target, direction)]
                    if negated:
                        arm.feedback -= FEEDBACK_BONUS
                    else:
                        arm.feedback += FEEDBACK_BONUS + 0.01 * order  # later comments win ties
                        arm.feedback_line = line


# ---------------------------------------------------------------------------------------------
# Writing it up
# ---------------------------------------------------------------------------------------------


def _verb(knob: Knob, d: int) -> str:
    if knob.kind == CHOICE:
        return "Change"
    return "Raise" if d > 0 else "Lower"


def _noun(knob: Knob, d: int) -> str:
    if knob.kind == CHOICE:
        return "move towards " + ("more short-window layers" if d > 0 else "more full-context layers")
    return "increase" if d > 0 else "decrease"


def _fmt_delta(delta: float | None) -> str:
    return "no val_bpb" if delta is None else f"{delta:+.4f} val_bpb"


def _fmt_val(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


def _evidence(arm: Arm, size: str) -> str:
    """One or two sentences on what history says about this arm."""
    knob, d, name = arm.knob, arm.direction, arm.knob.name
    same = [o for o in arm.outcomes if o.entry.status in ("keep", "discard", "crash")]
    opposite = [o for o in arm.mirrored]
    parts: list[str] = []
    if same:
        o = same[-1]
        what = f"the last {_noun(knob, d)} of {name} ({_fmt_val(o.old)} -> {_fmt_val(o.new)}"
        what += ", combined with another change)" if o.combined else ")"
        if o.entry.status == "keep":
            parts.append(f"{what[0].upper()}{what[1:]} was kept ({_fmt_delta(o.entry.delta)}); pushing further in "
                         f"the same direction{' with a bigger step' if size == 'big' else ''} tests whether the "
                         "optimum lies beyond the current value.")
        elif o.crash == "blocking":
            parts.append(f"{what[0].upper()}{what[1:]} crashed, so this stays short of the value that crashed.")
        elif o.crash == "other code":
            parts.append(f"{what[0].upper()}{what[1:]} crashed, but on an earlier version of train.py's code, "
                         "which has changed since, so the direction is open again.")
        elif o.entry.status == "crash":
            parts.append(f"{what[0].upper()}{what[1:]} crashed more than {CRASH_MEMORY} experiments ago, long "
                         "enough to try the direction once more.")
        elif o.reward > 0:
            parts.append(f"{what[0].upper()}{what[1:]} improved val_bpb ({_fmt_delta(o.entry.delta)}) but not by "
                         "enough to keep; trying the direction again from the current main.")
        else:
            parts.append(f"{what[0].upper()}{what[1:]} did not help ({_fmt_delta(o.entry.delta)})"
                         + ("; a smaller step checks whether the earlier one overshot." if size == "small" else
                            "; the other candidates look even less promising, so it gets another, different step."))
    if opposite:
        o = opposite[-1]
        other = _noun(knob, -d)
        if o.entry.status == "crash":
            parts.append(f"The opposite {other} of {name} ({_fmt_val(o.old)} -> {_fmt_val(o.new)}) crashed "
                         "(perhaps out of memory or time), so this explores the other side instead.")
        elif o.entry.status == "keep":
            parts.append(f"The opposite {other} was kept earlier ({_fmt_delta(o.entry.delta)}), so this checks "
                         "whether it overshot.")
        elif o.reward < 0:
            parts.append(f"The opposite {other} of {name} ({_fmt_val(o.old)} -> {_fmt_val(o.new)}) hurt "
                         f"({_fmt_delta(o.entry.delta)}), which suggests the optimum lies on this side.")
        else:
            parts.append(f"The opposite {other} of {name} was not a clear win ({_fmt_delta(o.entry.delta)}).")
    if not same and not opposite:
        parts.append(f"{name} has not been varied yet.")
    return " ".join(parts)


def _rationale(arm: Arm) -> str:
    return f"{arm.knob.name} is {arm.knob.what}; {arm.knob.up if arm.direction > 0 else arm.knob.down}."


def _helped(arm: Arm) -> str:
    """The best earlier outcome of this arm, as a clause."""
    o = max((o for o in arm.outcomes if o.reward > 0), key=lambda o: (o.reward, -(o.entry.delta or 0)))
    verdict = "was kept" if o.entry.status == "keep" else "improved val_bpb without being kept"
    return (f"the {_noun(arm.knob, arm.direction)} of {arm.knob.name} ({_fmt_val(o.old)} -> {_fmt_val(o.new)}) "
            f"{verdict} ({_fmt_delta(o.entry.delta)})")


def _describe(arm: Arm, size: str, new: Any, new_src: str) -> tuple[str, str, dict[str, Any]]:
    knob, d = arm.knob, arm.direction
    title = f"{_verb(knob, d)} {knob.name} {arm.const.source} -> {new_src}"
    text = f"{_evidence(arm, size)} {_rationale(arm)}"
    change = {"name": knob.name, "old": arm.const.value, "new": new, "direction": d, "size": size}
    return title, text, change


# ---------------------------------------------------------------------------------------------
# The explorer
# ---------------------------------------------------------------------------------------------


def _block_help(device_kind: str) -> str:
    names = [k.name for k in KNOBS if _live(k, device_kind)]
    return (
        "train.py needs a block of module-level hyperparameter constants, one plain assignment of a "
        "literal per line, for example:\n\n"
        "    DEPTH = 8                    # transformer layers\n"
        "    CPU_DEPTH = 2\n"
        "    MATRIX_LR = 0.04\n"
        "    TOTAL_BATCH_SIZE = 2**19\n"
        '    WINDOW_PATTERN = "SSSL"\n\n'
        f"The explorer tunes these names on device_kind {device_kind!r}: {', '.join(names)}."
    )


def _live(knob: Knob, device_kind: str) -> bool:
    if knob.scope == SHARED:
        return True
    if knob.scope == CPU:
        return device_kind == "cpu"
    return device_kind == "cuda"


class OfflineExplorer:
    """Deterministic UCB bandit over (constant, direction) arms of train.py's hyperparameter block."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    # The public entry point --------------------------------------------------------------------

    def propose(self, ctx: ProposalContext) -> Proposal:
        consts = find_constants(ctx.train_py)
        knobs = [k for k in KNOBS if _live(k, ctx.device_kind) and k.name in consts
                 and _usable(k, consts[k.name].value)]
        if not knobs:
            raise AgentError("explorer found no tunable constant in train.py. " + _block_help(ctx.device_kind))
        seq_len = _seq_len(ctx.profile)
        if not batch_splits({n: c.value for n, c in consts.items()}, ctx.device_kind, seq_len):
            total_name, device_name = _batch_names(ctx.device_kind)
            raise AgentError(
                f"train.py on main does not split its batch into whole forward passes: {total_name} = "
                f"{consts[total_name].source} is not a positive multiple of {device_name} * seq_len = "
                f"{consts[device_name].source} * {seq_len} (profile {ctx.profile}), so every run of it crashes. "
                f"Set {total_name} to a multiple of {device_name} * {seq_len} on main first.")

        main_hash = code_hash(ctx.train_py)
        rng = random.Random(self._rng_seed(ctx, main_hash))
        arms: dict[tuple[str, int], Arm] = {}
        for k in knobs:
            for d in (1, -1):
                arms[(k.name, d)] = Arm(knob=k, const=consts[k.name], direction=d, jitter=rng.random() * JITTER)
        shape = skeleton(ctx.train_py)
        _learn(arms, ctx.history, shape)
        _apply_feedback(arms, ctx.feedback, ctx.history)
        ranked = sorted(arms.values(), key=lambda a: (-a.score, a.knob.name, -a.direction))

        if self._losing_streak(ctx.history):
            combo = self._combine(ctx, ranked, consts, seq_len, shape)
            if combo is not None:
                return combo

        tried = 0
        for arm in ranked:
            for size, new in arm.candidates():
                tried += 1
                made = self._edit(ctx, consts, seq_len, [(arm, new)])
                if made is None:
                    continue
                text, (new_src,), followed = made
                title, body, change = _describe(arm, size, new, new_src)
                meta: dict[str, Any] = {"changes": [change], "skeleton": shape, "explorer": self._explain(arm)}
                if arm.feedback > 0 and arm.feedback_line:
                    body += f" This follows the human's comment: \"{arm.feedback_line.strip()}\"."
                    meta["feedback"] = arm.feedback_line
                if followed:
                    (f,) = followed
                    title += f" ({f['name']} {f['old_src']} -> {f['new_src']})"
                    body += (f" {f['name']} moves with it ({f['old_src']} -> {f['new_src']}), so that a step is "
                             f"still a whole number of forward passes of {seq_len}-token sequences; that only "
                             "changes how the step is computed, so any difference in val_bpb can be attributed "
                             "to the batch size.")
                    change["with"] = [{k: v for k, v in f.items() if k in ("name", "old", "new")}]
                else:
                    body += (" Nothing else changes, so any difference in val_bpb can be attributed to this one "
                             "constant.")
                return Proposal(title=title, hypothesis=body, train_py=text, meta=meta)

        raise AgentError(
            f"explorer exhausted: all {tried} nearby edits of the tunable constants "
            f"({', '.join(k.name for k in knobs)}) from the current main were already tried, would not split "
            f"the batch into whole forward passes, or lie at or beyond a crash of the last {CRASH_MEMORY} "
            "experiments. Edit train.py by hand, widen the explorer's bounds, or configure an LLM agent."
        )

    # Internals ------------------------------------------------------------------------------------

    def _rng_seed(self, ctx: ProposalContext, main_hash: str) -> int:
        key = f"{self.seed}|{main_hash}|{len(ctx.history)}|{ctx.device_kind}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")

    def _explain(self, arm: Arm) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "arm": f"{arm.knob.name}{'+' if arm.direction > 0 else '-'}",
            "score": round(arm.score, 4),
            "mean": round(arm.q, 4),
            "bonus": round(arm.bonus, 4),
            "tries": len(arm.outcomes),
        }

    @staticmethod
    def _edit(ctx: ProposalContext, consts: dict[str, Constant], seq_len: int | None,
              moves: list[tuple[Arm, Any]]) -> tuple[str, list[str], list[dict[str, Any]]] | None:
        """train.py with these moves (and the micro-batch that must follow them), the new values'
        sources and the followers; None when the result is main or was seen before, does not
        compile, or would not split its batch into whole forward passes."""
        sources = [format_value(arm.knob, arm.const, new) for arm, new in moves]
        edits = [(arm.const, src) for (arm, _), src in zip(moves, sources)]
        values = {n: c.value for n, c in consts.items()} | {arm.knob.name: new for arm, new in moves}
        followed: list[dict[str, Any]] = []
        moved = {arm.knob.name for arm, _ in moves}
        for arm, new in moves:
            for const, knob, value in _followers(arm.knob, new, consts, ctx.device_kind, seq_len):
                if const.name in moved:
                    continue  # moved on purpose already; the batch check below decides
                src = format_value(knob, const, value)
                edits.append((const, src))
                values[const.name] = value
                followed.append({"name": const.name, "old": const.value, "new": value,
                                 "old_src": const.source, "new_src": src})
        if not batch_splits(values, ctx.device_kind, seq_len):
            return None
        text = apply_edits(ctx.train_py, edits)
        h = code_hash(text)
        if h == code_hash(ctx.train_py) or h in ctx.seen_hashes or not _compiles(text):
            return None
        return text, sources, followed

    @staticmethod
    def _streak(history: list[HistoryEntry]) -> int:
        """How many experiments in a row, most recent first, were discarded or crashed."""
        streak = 0
        for e in reversed(history):
            if e.status == "running":
                continue
            if e.status not in ("discard", "crash"):
                break
            streak += 1
        return streak

    def _losing_streak(self, history: list[HistoryEntry]) -> bool:
        streak = self._streak(history)
        return streak >= COMBINE_AFTER and (streak - COMBINE_AFTER) % COMBINE_EVERY == 0

    def _combine(self, ctx: ProposalContext, ranked: list[Arm], consts: dict[str, Constant], seq_len: int | None,
                 shape: str) -> Proposal | None:
        """Two different constants, each moved in a direction that helped before, in one proposal."""
        helped = [a for a in ranked if a.feedback >= 0 and not a.crashes and any(o.reward > 0 for o in a.outcomes)]
        for i, a in enumerate(helped):
            for b in helped[i + 1 :]:
                if a.knob.name == b.knob.name:
                    continue
                ca, cb = a.candidates(), b.candidates()
                if not ca or not cb:
                    continue
                (sa, va), (sb, vb) = ca[0], cb[0]
                made = self._edit(ctx, consts, seq_len, [(a, va), (b, vb)])
                if made is None:
                    continue
                text, (src_a, src_b), followed = made
                ta, _, cha = _describe(a, sa, va, src_a)
                tb, _, chb = _describe(b, sb, vb, src_b)
                for ch in (cha, chb):  # only the total batch has followers
                    if followed and ch["name"] == _batch_names(ctx.device_kind)[0]:
                        ch["with"] = [{k: v for k, v in f.items() if k in ("name", "old", "new")} for f in followed]
                lower = lambda s: s[0].lower() + s[1:]  # noqa: E731
                title = f"Combine: {lower(ta)}, {lower(tb)}"
                body = (
                    f"The last {self._streak(ctx.history)} experiments were all discarded, so this combines two "
                    f"directions that helped earlier: {_helped(a)} and {_helped(b)}. {_rationale(a)} "
                    f"{_rationale(b)} Moving both at once tests whether their gains add up; if it helps, later "
                    "single changes can tell which one mattered."
                )
                meta = {"changes": [cha, chb], "combined": True, "skeleton": shape,
                        "explorer": {"seed": self.seed, "arms": [self._explain(a), self._explain(b)]}}
                return Proposal(title=title, hypothesis=body, train_py=text, meta=meta)
        return None


def _compiles(text: str) -> bool:
    try:
        compile(text, "train.py", "exec")
    except SyntaxError:
        return False
    return True
