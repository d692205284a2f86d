"""Writing a proposal up: its title, the evidence from history, and why the change might help.

`describe` turns an arm and its new value into a title ("Lower MATRIX_LR 0.04 -> 0.027"), a
hypothesis (what history says about the arm, then the knob's rationale) and the ``meta["changes"]``
record that `bot.agent.arms.learn` reads back later; `what_helped` and `rationale` serve the combined
proposals. Deltas are told in the task's metric (training's val_bpb unless another task is given),
on its own scale (the history keeps them on the loss scale, Metric.loss).
"""

from __future__ import annotations

from typing import Any

from bot.agent.arms import Arm, Outcome
from bot.agent.crash_memory import CRASH_MEMORY
from bot.agent.knobs import CHOICE, FLAG, Knob
from bot.core.states import NO_NUMBER
from runner.tasks import TRAINING, Metric, Task


def _verb(knob: Knob, d: int) -> str:
    if knob.kind == CHOICE:
        return "Change"
    if knob.kind == FLAG:
        return "Switch on" if d > 0 else "Switch off"
    return "Raise" if d > 0 else "Lower"


def _noun(knob: Knob, d: int) -> str:
    if knob.kind == CHOICE:
        return "move towards " + ("more short-window layers" if d > 0 else "more full-context layers")
    if knob.kind == FLAG:
        return "switching on" if d > 0 else "switching off"
    return "increase" if d > 0 else "decrease"


def _fmt_delta(delta: float | None, metric: Metric) -> str:
    return f"no {metric.name}" if delta is None else f"{metric.format_change(delta, 4)} {metric.name}"


def _fmt_val(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


def _ended(outcome: Outcome) -> str:
    """How an experiment that got no number ended, in words: crashed, or was rejected (and why)."""
    if outcome.entry.status == "rejected":
        return f"was rejected ({_reason(outcome)})"
    return "crashed"


def _reason(outcome: Outcome) -> str:
    """The first line of why an experiment was rejected, as its error tail says it."""
    lines = (outcome.entry.error_tail or "").strip().removeprefix("rejected: ").splitlines()
    return lines[0] if lines else "no reason given"


def _evidence(arm: Arm, size: str, task: Task) -> str:
    """One or two sentences on what history says about this arm."""
    metric = task.metric
    knob, d, name = arm.knob, arm.direction, arm.knob.name
    same = [o for o in arm.outcomes if o.entry.status in ("keep", "discard", *NO_NUMBER)]
    opposite = [o for o in arm.mirrored]
    parts: list[str] = []
    if same:
        o = same[-1]
        what = f"the last {_noun(knob, d)} of {name} ({_fmt_val(o.old)} -> {_fmt_val(o.new)}"
        what += ", combined with another change)" if o.combined else ")"
        if o.entry.status == "keep":
            parts.append(
                f"{what[0].upper()}{what[1:]} was kept ({_fmt_delta(o.entry.delta, metric)}); pushing further in "
                f"the same direction{' with a bigger step' if size == 'big' else ''} tests whether the "
                "optimum lies beyond the current value."
            )
        elif o.crash == "blocking":
            failed = "was rejected" if o.entry.status == "rejected" else "crashed"
            parts.append(f"{what[0].upper()}{what[1:]} {_ended(o)}, so this stays short of the value that {failed}.")
        elif o.crash == "other code":
            parts.append(
                f"{what[0].upper()}{what[1:]} {_ended(o)}, but on an earlier version of {task.asset}'s code, "
                "which has changed since, so the direction is open again."
            )
        elif o.entry.status in NO_NUMBER:
            parts.append(
                f"{what[0].upper()}{what[1:]} {_ended(o)} more than {CRASH_MEMORY} experiments ago, long "
                "enough to try the direction once more."
            )
        elif o.reward > 0:
            parts.append(
                f"{what[0].upper()}{what[1:]} improved {metric.name} ({_fmt_delta(o.entry.delta, metric)}) but not by "
                "enough to keep; trying the direction again from the current main."
            )
        else:
            parts.append(
                f"{what[0].upper()}{what[1:]} did not help ({_fmt_delta(o.entry.delta, metric)})"
                + (
                    "; a smaller step checks whether the earlier one overshot."
                    if size == "small"
                    else "; the other candidates look even less promising, so it gets another, different step."
                )
            )
    if opposite:
        o = opposite[-1]
        other = _noun(knob, -d)
        if o.entry.status == "crash":
            parts.append(
                f"The opposite {other} of {name} ({_fmt_val(o.old)} -> {_fmt_val(o.new)}) crashed "
                "(perhaps out of memory or time), so this explores the other side instead."
            )
        elif o.entry.status == "rejected":
            parts.append(
                f"The opposite {other} of {name} ({_fmt_val(o.old)} -> {_fmt_val(o.new)}) was rejected "
                f"({_reason(o)}), so this explores the other side instead."
            )
        elif o.entry.status == "keep":
            parts.append(
                f"The opposite {other} was kept earlier ({_fmt_delta(o.entry.delta, metric)}), so this checks "
                "whether it overshot."
            )
        elif o.reward < 0:
            parts.append(
                f"The opposite {other} of {name} ({_fmt_val(o.old)} -> {_fmt_val(o.new)}) hurt "
                f"({_fmt_delta(o.entry.delta, metric)}), which suggests the optimum lies on this side."
            )
        else:
            parts.append(f"The opposite {other} of {name} was not a clear win ({_fmt_delta(o.entry.delta, metric)}).")
    if not same and not opposite:
        parts.append(f"{name} has not been varied yet.")
    return " ".join(parts)


def rationale(arm: Arm) -> str:
    return f"{arm.knob.name} is {arm.knob.what}; {arm.knob.up if arm.direction > 0 else arm.knob.down}."


def what_helped(arm: Arm, metric: Metric = TRAINING.metric) -> str:
    """The best earlier outcome of this arm, as a clause."""
    o = max((o for o in arm.outcomes if o.reward > 0), key=lambda o: (o.reward, -(o.entry.delta or 0)))
    verdict = "was kept" if o.entry.status == "keep" else f"improved {metric.name} without being kept"
    return (
        f"the {_noun(arm.knob, arm.direction)} of {arm.knob.name} ({_fmt_val(o.old)} -> {_fmt_val(o.new)}) "
        f"{verdict} ({_fmt_delta(o.entry.delta, metric)})"
    )


def describe(arm: Arm, size: str, new: Any, new_src: str, task: Task = TRAINING) -> tuple[str, str, dict[str, Any]]:
    knob, d = arm.knob, arm.direction
    title = f"{_verb(knob, d)} {knob.name} {arm.const.source} -> {new_src}"
    text = f"{_evidence(arm, size, task)} {rationale(arm)}"
    change = {"name": knob.name, "old": arm.const.value, "new": new, "direction": d, "size": size}
    return title, text, change
