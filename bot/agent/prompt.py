"""What the Claude agent is told: the system prompt (its role and rules) and the context of one proposal.

Both speak the proposal's task (runner.tasks, `ProposalContext.task`): its asset (train.py,
router.py, query.sql) and its metric with its direction. Training's texts are the ones it always had;
for another task the numbers, which the loop keeps on the loss scale, are shown on the metric's own
(Metric.loss is its own inverse), and program.md says what the evaluator calls and checks.

The context is the first user message, in two blocks. The stable one, program.md and main's
asset, changes only when main changes and carries a cache breakpoint, so that every turn of a
proposal, and the next proposals on the same main, read it from the prompt cache. The volatile one
comes after it: main's value of the metric, the history (one compact line per experiment), the
proposals being tried now with their diffs (several proposals are prepared at once, one per free
runner: this one must differ from them), the humans' feedback and the last crash. A history of 50
experiments stays a few thousand tokens, and the diffs in flight at most IN_FLIGHT_CHARS.
"""

from __future__ import annotations

from typing import Any

from bot.agent.editor import HARNESS_MD, PROGRAM_MD, ROOT, TRAIN_PY
from bot.core.records import HistoryEntry, ProposalContext
from runner.tasks import DEFAULT_TASK, TRAINING, Task, get_task

EPHEMERAL = {"type": "ephemeral"}
HISTORY_IN_FULL = 60  # the most recent experiments listed one per line; older ones are counted
TITLE_CHARS = 90
LESSON_CHARS = 140
FEEDBACK_CHARS = 1500
CRASH_CHARS = 3000
CRASH_LINES = 60
IN_FLIGHT_CHARS = 12_000  # the diffs of the proposals being tried, all together; beyond it titles only

SYSTEM_PROMPT = f"""\
You are the research agent of autoresearch: you improve a small language model's training script,
train.py, one experiment at a time. Each experiment you propose is trained by a fixed harness for a
fixed time budget and scored by val_bpb (validation bits per byte; lower is better). It is kept and
merged into main only when it beats main by clearly more than the run-to-run noise.

# Your workspace and tools
- {ROOT}/{TRAIN_PY}: main's train.py, the only file you may change. Its text is also in the context.
- {ROOT}/{PROGRAM_MD}: the human's research program (read-only; also in the context).
- {ROOT}/{HARNESS_MD}: the harness interface train.py must keep using (read-only).
- The text editor tool views and edits these files. Prefer small str_replace edits with enough
  context to match exactly once; view train.py around a change if unsure of its exact text.
- submit ends the proposal: train.py as it then stands becomes the experiment.

# Rules
- Change only train.py. Keep the harness interface exactly: h = harness.session(), batches from
  h.train_batches(...), h.step_done(loss) once per optimizer step, train while not h.time_up(), end
  with h.finish(model); model(x) returns logits [batch, sequence, vocabulary].
- One idea per experiment, small enough that its result teaches something. Do not bundle unrelated
  changes: a combined change that fails tells us nothing.
- The budget is fixed training time, so speed matters: a change wins by learning more per step or
  by taking more steps in the same time. Weigh the cost per step of whatever you add. Stay within
  the machine's memory: a run that runs out of memory is a crash.
- Never try to fool the metric. val_bpb is measured by the harness on data train.py never sees,
  with its own clock; what train.py prints is ignored. Reading validation data, the clock or the
  harness's internals, or touching files, processes or the network, is pointless and forbidden.
- Use only what is installed: PyTorch, NumPy and the standard library.
- Read the history: never repeat an experiment that was tried, push directions that helped, back
  off from those that hurt, and after a crash read its traceback before touching that code again.
- Simpler is better: an equal result from less code is a win.

# Submitting
Call submit with a short imperative title (under 60 characters, e.g. "Raise MATRIX_LR to 0.05"),
a hypothesis (what you changed and why it should lower val_bpb, 2-5 sentences), expected_effect
(the val_bpb change you expect and by what mechanism) and risk (what could go wrong). Set
fixes_failure to true when the change repairs the last crash or rejection shown in the context.
submit checks that train.py changed, compiles, keeps the harness interface and is new; if it
reports a problem, fix it and submit again. You have a limited number of turns: work efficiently,
and do not end your turn without calling submit.
"""


TASK_PROMPT = """\
You are the research agent of autoresearch: you improve {asset}, one experiment at a time. The task:
{summary}. Each experiment you propose is measured by a fixed evaluator, a trusted process, and
scored by {metric} ({unit}; {direction} is better). It is kept and merged into main only when it
beats main by clearly more than the run-to-run noise.

# Your workspace and tools
- {root}/{asset}: main's {asset}, the only file you may change. Its text is also in the context.
- {root}/{program}: the human's research program (read-only; also in the context). It says what the
  evaluator calls or runs in {asset}, what it checks before it measures, and what is fair game.
- The text editor tool views and edits these files. Prefer small str_replace edits with enough
  context to match exactly once; view {asset} around a change if unsure of its exact text.
- submit ends the proposal: {asset} as it then stands becomes the experiment.

# Rules
- Change only {asset}, and keep what the evaluator needs of it exactly as program.md says.
- One idea per experiment, small enough that its result teaches something. Do not bundle unrelated
  changes: a combined change that fails tells us nothing.
- Never try to fool the metric. {metric} is computed by the evaluator from what it measures itself;
  what {asset} prints or claims is ignored. A correctness gate runs first: an asset that fails it,
  or reaches for data, files, processes or the network it may not, is rejected with the reason.
- Read the history: never repeat an experiment that was tried, push directions that helped, back
  off from those that hurt, and after a crash or a rejection read its reason before touching that
  part again.
- Simpler is better: an equal result from less code is a win.

# Submitting
Call submit with a short imperative title (under 60 characters), a hypothesis (what you changed and
why it should {better} {metric}, 2-5 sentences), expected_effect (the {metric} change you expect and
by what mechanism) and risk (what could go wrong). Set fixes_failure to true when the change repairs
the last crash or rejection shown in the context. submit checks that {asset} changed, passes its
static check and is new; if it reports a problem, fix it and submit again. You have a limited
number of turns: work efficiently, and do not end your turn without calling submit.
"""


def system_prompt(task: str = DEFAULT_TASK) -> str:
    """The role and rules for the task: the same for every proposal (cached)."""
    if task == DEFAULT_TASK:
        return SYSTEM_PROMPT
    spec = get_task(task)
    return TASK_PROMPT.format(
        asset=spec.asset,
        summary=spec.summary,
        metric=spec.metric.name,
        unit=spec.metric.unit,
        direction=spec.metric.direction,
        better="lower" if spec.metric.lower_is_better else "raise",
        root=ROOT,
        program=PROGRAM_MD,
    )


def context_blocks(ctx: ProposalContext) -> list[dict[str, Any]]:
    """The first user message's content: the stable block (cache breakpoint), then the volatile one."""
    asset = get_task(ctx.task).asset
    language = "sql" if asset.endswith(".sql") else "python"
    stable = (
        f"# {PROGRAM_MD}: the research program\n\n{ctx.program_md.strip()}\n\n"
        f"# {asset} on main{f' (commit {ctx.main_sha[:12]})' if ctx.main_sha else ''}: "
        f"also at {ROOT}/{asset}\n\n```{language}\n{ctx.asset.rstrip()}\n```\n"
    )
    return [
        {"type": "text", "text": stable, "cache_control": dict(EPHEMERAL)},
        {"type": "text", "text": volatile_text(ctx)},
    ]


def volatile_text(ctx: ProposalContext) -> str:
    task = get_task(ctx.task)
    parts = [_now(ctx, task), _history(ctx.history, task)]
    if ctx.in_flight:
        parts.append(_in_flight(ctx, task))
    if ctx.feedback:
        parts.append(_feedback(ctx.feedback))
    if ctx.last_crash:
        parts.append(_crash(ctx.last_crash, ctx.last_crash_id, rejected=ctx.last_crash_status == "rejected"))
    parts.append(
        f"Propose the next experiment: make one change to {ROOT}/{task.asset} with the editor, then call submit."
    )
    return "\n\n".join(parts) + "\n"


def _now(ctx: ProposalContext, task: Task) -> str:
    if task.name != DEFAULT_TASK:
        value = (
            f"main's {task.metric.name} is {task.metric.format(task.metric.value(ctx.main_val_bpb))} "
            f"({task.metric.unit}, the mean of its baseline runs; {task.metric.direction} is better)"
            if ctx.main_val_bpb is not None
            else "main has not been measured yet"
        )
        return f"# Now\nProfile {ctx.profile}; {value}."
    bpb = (
        f"main's val_bpb is {ctx.main_val_bpb:.6f} (the mean of its baseline runs)"
        if ctx.main_val_bpb is not None
        else "main has not been measured yet"
    )
    live = (
        "; train.py's CPU_* size constants are the live ones"
        if ctx.device_kind == "cpu" and "CPU_" in ctx.asset
        else ""
    )
    return f"# Now\nProfile {ctx.profile} on {ctx.device_kind}{live}; {bpb}."


def history_line(e: HistoryEntry, task: Task = TRAINING) -> str:
    """One experiment: id, status, delta (the change it made to the task's metric), margin, title, lesson."""
    cells = [f"#{e.id}", e.status]
    if e.delta is not None:
        cells.append(f"d={task.metric.format_change(e.delta, 4)}")
    if e.margin is not None:
        cells.append(f"m={task.metric.format_margin(e.margin, 4)}")
    line = " ".join(cells) + " " + _clip(e.title, TITLE_CHARS)
    if e.lesson:
        line += " | " + _clip(e.lesson, LESSON_CHARS)
    return line


def _history(history: list[HistoryEntry], task: Task) -> str:
    if not history:
        return "# History\nNo experiments yet: this is the first one."
    metric = task.metric
    head = (
        f"# History: {len(history)} experiments, oldest first (d = {metric.name}"
        f"{' relative to' if metric.relative else ' minus'} main's at the time, "
        f"{'negative' if metric.lower_is_better else 'positive'} is better; m = the noise margin it was judged with)"
    )
    older, recent = history[:-HISTORY_IN_FULL], history[-HISTORY_IN_FULL:]
    lines = [head]
    if older:
        counts: dict[str, int] = {}
        for e in older:
            counts[e.status] = counts.get(e.status, 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        lines.append(f"#{older[0].id}-#{older[-1].id}: {len(older)} earlier experiments ({summary}).")
        kept = [e for e in older if e.status == "keep"]
        if kept:
            lines.append(
                "Kept among them (now part of main): "
                + "; ".join(f"#{e.id} {_clip(e.title, 60)}" for e in kept[-20:])
                + "."
            )
    lines.extend(history_line(e, task) for e in recent)
    return "\n".join(lines)


def _in_flight(ctx: ProposalContext, task: Task) -> str:
    titles = {e.id: e.title for e in ctx.history}
    lines = [
        f"# Being tried now: {len(ctx.in_flight)} proposals not judged yet (running in the history), each "
        f"with its change to {task.asset} on main. Other proposals are being written at the same time as "
        "yours. Do not propose any of these again, nor something close to one: propose something different."
    ]
    room = IN_FLIGHT_CHARS
    for exp_id, diff in sorted(ctx.in_flight.items()):
        lines.append(f"## #{exp_id} {_clip(titles.get(exp_id, ''), TITLE_CHARS)}")
        if diff and len(diff) <= room:
            lines.append(f"```diff\n{diff}\n```")
            room -= len(diff)
    return "\n".join(lines)


def _feedback(feedback: list[str]) -> str:
    lines = [
        (
            "# Feedback (trusted, oldest first). Follow it where it applies; a line starting with /try is "
            "an idea a human asked you to try."
        )
    ]
    lines.extend("- " + _clip(text, FEEDBACK_CHARS) for text in feedback if text.strip())
    return "\n".join(lines)


def _crash(tail: str, exp_id: int | None, *, rejected: bool = False) -> str:
    which = f"experiment #{exp_id}" if exp_id is not None else "the last experiment"
    text = "\n".join(tail.strip().splitlines()[-CRASH_LINES:])[-CRASH_CHARS:]
    what = "rejection: its run was refused a number, for this reason" if rejected else "crash"
    said = "" if rejected else "Its traceback's tail:\n"
    return (
        f"# The last {what}: {which}\n{said}```\n{text}\n```\n"
        "If your change fixes it, set fixes_failure to true in submit."
    )


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"
