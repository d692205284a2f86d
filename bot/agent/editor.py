"""The Claude agent's tools: a text editor over an in-memory workspace, and `submit`.

The workspace holds, under /repo, the task's asset (runner.tasks: train.py, router.py, query.sql;
the only writable file: the experiment), program.md (the human's research program) and, for
train.py, harness.md (the interface train.py must keep using). Nothing touches the disk or a git
checkout: the agent's result is the final text of the asset.

Every call gets an answer. A bad one gets a `ToolResult` with `error` set to the kind of failure:
the Claude agent returns the message to the model once and gives up on the second failure of the
same kind in a row (bot.agent.claude).

The tool definitions follow Anthropic's text editor tool (commands view, str_replace, insert,
create and undo_edit); `submit` is our own (`submit_tool(task)` names the task's asset and metric).
`check_asset` is what a submitted asset must pass: for train.py the checks below, for another task's
asset bot.core.validation's, which the conductor applies again to whatever it is given.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bot.core import pysource, validation
from bot.core.records import code_hash
from runner.tasks import DEFAULT_TASK, get_task

ROOT = "/repo"
TRAIN_PY = "train.py"
PROGRAM_MD = "program.md"
HARNESS_MD = "harness.md"

# Kinds of failure, named for the error message the skip records.
BAD_CALL = "malformed tool call"
NOT_APPLIED = "edit that does not apply"
READ_ONLY = "write to a read-only file"

# What train.py may use of runner/harness.py: the model reads it as /repo/harness.md. It names only
# what exists there (tests/bot/agent/test_editor.py checks that against runner/harness.py).
HARNESS_SUMMARY = """\
# The harness interface (runner/harness.py, read-only)

train.py is run by a fixed harness that owns the data, the tokenizer, the time budget and the
evaluation. train.py must keep using it exactly like this:

```python
from runner import harness

h = harness.session()          # the run's session: profile, device, data, clock
h.profile                      # the profile: .name, .seq_len, .vocab_size, .time_budget_s, .clock ("wall"/"cpu")
h.device                       # torch.device to train on ("cuda" on GPU profiles, "cpu" otherwise)
h.seq_len                      # tokens per training row
h.vocab_size                   # tokenizer size
batches = h.train_batches(batch_size)   # endless (x, y) LongTensor pairs of [batch_size, seq_len] on h.device
while not h.time_up():         # train until the harness's clock says the budget is spent
    ...                        # forward, backward, optimizer step
    h.step_done(loss)          # once per optimizer step; a NaN or infinite loss ends the run
    h.progress()               # fraction of the budget used, in [0, 1]: use it for LR schedules
    h.step                     # optimizer steps reported so far
h.finish(model)                # the harness evaluates val_bpb itself; optional flops_per_token=, extra={}
```

Rules the harness enforces:
- `model(x)` must return logits of shape [batch, sequence, vocabulary]; `h.finish` scores them on
  validation data train.py never sees. What train.py prints is never read.
- The budget is counted by the harness's clock, not train.py's: on GPU profiles the wall time of each
  step after the first warm-up steps, on CPU profiles the process's CPU time divided by the allotted
  threads. Changing torch's thread count on a CPU profile ends the run.
- Only PyTorch, NumPy and the standard library are installed. No network, no subprocesses.
"""

# Names train.py must still use: the session, batches, step reports, the clock, and the hand-over.
HARNESS_USES = ("session", "train_batches", "step_done", "time_up", "finish")


def editor_tool(model: str) -> dict[str, Any]:
    """Anthropic's text editor tool in the version `model` understands (Claude 4 and later:
    text_editor_20250728; Claude 3.x: text_editor_20250124)."""
    if model.startswith("claude-3"):
        return {"type": "text_editor_20250124", "name": "str_replace_editor"}
    return {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}


EDITOR_NAMES = frozenset({"str_replace_based_edit_tool", "str_replace_editor"})

SUBMIT_TOOL: dict[str, Any] = {
    "name": "submit",
    "description": (
        "Finish this proposal: train.py as it now stands in /repo becomes the experiment. Call it once "
        "your edits are complete. It fails (and tells you why) when train.py is unchanged, does not "
        "compile, is too large, no longer uses the harness interface, or repeats an earlier experiment."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "title": {
                "type": "string",
                "maxLength": 80,
                "description": "A short imperative title, under 60 characters (e.g. 'Raise MATRIX_LR to 0.05').",
            },
            "hypothesis": {
                "type": "string",
                "description": "What you changed and why it should lower val_bpb, in 2-5 plain sentences.",
            },
            "expected_effect": {
                "type": "string",
                "description": "The val_bpb change you expect and how (e.g. '-0.005: more steps in the same budget').",
            },
            "risk": {
                "type": "string",
                "description": "What could go wrong: a crash, running out of memory, a slower step, divergence.",
            },
            "fixes_failure": {
                "type": "boolean",
                "description": "true when this change fixes the last failure shown in the context: a crash, "
                "or a run refused a number (a rejection).",
            },
        },
        "required": ["title", "hypothesis", "expected_effect", "risk"],
    },
}

TITLE_MAX = 80


def submit_tool(task: str = DEFAULT_TASK) -> dict[str, Any]:
    """The submit tool for the task: SUBMIT_TOOL for training, the same fields naming another task's
    asset and metric otherwise."""
    if task == DEFAULT_TASK:
        return SUBMIT_TOOL
    spec = get_task(task)
    asset, metric = spec.asset, spec.metric.name
    better = "lower" if spec.metric.lower_is_better else "raise"
    tool = copy.deepcopy(SUBMIT_TOOL)
    tool["description"] = (
        f"Finish this proposal: {asset} as it now stands in /repo becomes the experiment. Call it once your "
        f"edits are complete. It fails (and tells you why) when {asset} is unchanged, fails its static check "
        "(see program.md for what the evaluator needs), is too large, or repeats an earlier experiment."
    )
    fields = tool["input_schema"]["properties"]
    fields["title"]["description"] = "A short imperative title, under 60 characters."
    fields["hypothesis"]["description"] = (
        f"What you changed and why it should {better} {metric}, in 2-5 plain sentences."
    )
    fields["expected_effect"]["description"] = f"The {metric} change you expect and how."
    fields["risk"]["description"] = "What could go wrong: a crash, a rejection by the evaluator's gate, a time-out."
    return tool


@dataclass
class ToolResult:
    """The answer to one tool call: its text, and the kind of failure when it failed."""

    text: str
    error: str | None = None

    @property
    def is_error(self) -> bool:
        return self.error is not None


@dataclass
class Submission:
    title: str
    hypothesis: str
    expected_effect: str
    risk: str
    fixes_failure: bool = False  # it repairs the last crash or rejection shown


def parse_submit(arguments: Mapping[str, Any]) -> Submission | ToolResult:
    """The submit call's fields, or a BAD_CALL result naming what is missing or mistyped."""
    if not isinstance(arguments, Mapping):
        return ToolResult("submit needs an object with title, hypothesis, expected_effect and risk.", BAD_CALL)
    fields: dict[str, str] = {}
    problems = []
    for name in ("title", "hypothesis", "expected_effect", "risk"):
        value = arguments.get(name)
        if not isinstance(value, str) or not value.strip():
            problems.append(f"{name} must be a non-empty string")
        else:
            fields[name] = value.strip()
    fixes = arguments.get("fixes_failure", False)
    if not isinstance(fixes, bool):
        problems.append("fixes_failure must be true or false")
    if problems:
        return ToolResult("submit was not accepted: " + "; ".join(problems) + ". Call submit again.", BAD_CALL)
    title = " ".join(fields["title"].split())
    if len(title) > TITLE_MAX:
        title = title[:TITLE_MAX].rsplit(" ", 1)[0].rstrip(" ,;:-") or title[:TITLE_MAX]
    return Submission(
        title=title,
        hypothesis=fields["hypothesis"],
        expected_effect=fields["expected_effect"],
        risk=fields["risk"],
        fixes_failure=fixes,
    )


def missing_harness_uses(text: str) -> list[str]:
    """What of the harness interface a (compiling) train.py no longer uses: the import of
    runner.harness and each of HARNESS_USES, as an attribute (h.step_done) or an imported name."""
    tree = pysource.parse(text)
    imported = False
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "runner":
            imported |= any(a.name == "harness" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "runner.harness":
            imported = True
            used.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            imported |= any(a.name == "runner.harness" for a in node.names)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
    missing = [] if imported else ["the import of runner.harness"]
    return missing + [f"h.{name}" for name in HARNESS_USES if name not in used]


def check_asset(text: str, *, main_asset: str, max_bytes: int, task: str = DEFAULT_TASK) -> tuple[str, str] | None:
    """Why a submitted asset cannot be an experiment, as (kind, message for the model); None if it can."""
    if task != DEFAULT_TASK:
        return _check_task_asset(text, main_asset=main_asset, max_bytes=max_bytes, task=task)
    if code_hash(text) == code_hash(main_asset):
        return ("unchanged", "train.py is identical to main's: there is nothing to measure. Edit it, then submit.")
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        return (
            "too large",
            (f"train.py is {size} bytes, over the limit of {max_bytes}. Make it smaller, then submit."),
        )
    try:
        compile(text, "train.py", "exec")
    except SyntaxError as error:
        return (
            "does not compile",
            (f"train.py does not compile: {error.msg} (line {error.lineno}). Fix it, then submit."),
        )
    missing = missing_harness_uses(text)
    if missing:
        return (
            "harness interface",
            "train.py no longer uses the harness interface: "
            + ", ".join(missing)
            + " missing. Read /repo/harness.md, restore them, then submit.",
        )
    return None


def _check_task_asset(text: str, *, main_asset: str, max_bytes: int, task: str) -> tuple[str, str] | None:
    """check_asset for a task other than training: bot.core.validation's checks, in words for the model."""
    asset = get_task(task).asset
    if code_hash(text) == code_hash(main_asset):
        return ("unchanged", f"{asset} is identical to main's: there is nothing to measure. Edit it, then submit.")
    problem = validation.problem("title", text, main_asset=main_asset, earlier=[], task=task, max_bytes=max_bytes)
    if problem is None:
        return None
    if "identical to main" in problem:
        return ("unchanged", f"{problem}: there is nothing to measure. Edit it, then submit.")
    if "more than the limit" in problem:
        return ("too large", f"{problem}. Make it smaller, then submit.")
    return ("invalid", f"{problem}. Read /repo/{PROGRAM_MD} for what the evaluator needs, fix it, then submit.")


class Workspace:
    """The task's asset (train.py, router.py, query.sql), program.md and, for train.py, harness.md in
    memory; only the asset can change."""

    def __init__(
        self, asset: str, program_md: str, harness_md: str = HARNESS_SUMMARY, *, asset_name: str = TRAIN_PY
    ) -> None:
        self.name = asset_name
        self.files = {asset_name: asset, PROGRAM_MD: program_md}
        if asset_name == TRAIN_PY:
            self.files[HARNESS_MD] = harness_md
        self._undo: list[str] = []

    @property
    def asset(self) -> str:
        return self.files[self.name]

    def description(self) -> str:
        """The workspace's files, as the tool's answers name them."""
        read_only = [f"{ROOT}/{n}" for n in self.files if n != self.name]
        return f"{ROOT}/{self.name} (writable), {' and '.join(read_only)} (read-only)"

    def run(self, arguments: Any) -> ToolResult:
        """Carry out one text editor call."""
        if not isinstance(arguments, Mapping):
            return ToolResult("The editor needs an object with a command and a path.", BAD_CALL)
        command = arguments.get("command")
        handlers = {
            "view": self._view,
            "str_replace": self._str_replace,
            "insert": self._insert,
            "create": self._create,
            "undo_edit": self._undo_edit,
        }
        if command not in handlers:
            return ToolResult(f"Unknown command {command!r}: use one of {', '.join(handlers)}.", BAD_CALL)
        path = arguments.get("path")
        if not isinstance(path, str):
            return ToolResult(f"{command} needs a path, such as {ROOT}/{self.name}.", BAD_CALL)
        name = self._resolve(path)
        if name is None and command == "view":
            return ToolResult(f"No such file: {path}. The workspace holds {self.description()}.", BAD_CALL)
        if name is None:
            return ToolResult(
                f"Refused: only {ROOT}/{self.name} may be written, and {path} is not it. Nothing was "
                f"written. The workspace holds {self.description()}.",
                READ_ONLY,
            )
        if command != "view" and name != self.name:
            return ToolResult(
                f"{path} is read-only: only {ROOT}/{self.name} may be changed. Nothing was written.", READ_ONLY
            )
        return handlers[command](name, arguments)

    # --- commands ----------------------------------------------------------------------------------
    def _view(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        if name == "":
            listing = "\n".join(f"{ROOT}/{n}{'' if n == self.name else '  (read-only)'}" for n in self.files)
            return ToolResult(f"Files in {ROOT}:\n{listing}")
        lines = self.files[name].splitlines()
        start, end = 1, len(lines)
        view_range = arguments.get("view_range")
        if view_range is not None:
            if (
                not isinstance(view_range, list)
                or len(view_range) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)
            ):
                return ToolResult("view_range must be two line numbers [start, end] (end -1: to the end).", BAD_CALL)
            start, end = view_range[0], (len(lines) if view_range[1] == -1 else view_range[1])
            if not 1 <= start <= max(1, len(lines)) or end < start:
                return ToolResult(
                    f"view_range {view_range} is outside {ROOT}/{name}, which has {len(lines)} lines.", BAD_CALL
                )
        return ToolResult(_numbered(lines, start, min(end, len(lines))))

    def _str_replace(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        old, new = arguments.get("old_str"), arguments.get("new_str", "")
        if not isinstance(old, str) or not old or not isinstance(new, str):
            return ToolResult(
                "str_replace needs old_str (non-empty text to find) and new_str (its replacement).", BAD_CALL
            )
        text = self.files[name]
        count = text.count(old)
        if count == 0:
            return ToolResult(
                f"No replacement was performed: old_str does not occur verbatim in {ROOT}/{name}. "
                "View the file and copy the exact text, whitespace included.",
                NOT_APPLIED,
            )
        if count > 1:
            lines = [text[:m].count("\n") + 1 for m in _find_all(text, old)]
            return ToolResult(
                f"No replacement was performed: old_str occurs {count} times in {ROOT}/{name} "
                f"(lines {', '.join(map(str, lines))}). Include more context to make it unique.",
                NOT_APPLIED,
            )
        at = text.index(old)
        self._write(name, text.replace(old, new, 1))
        first = text[:at].count("\n") + 1
        return ToolResult(
            f"The file {ROOT}/{name} has been edited. The result around the change:\n"
            + self._snippet(name, first, first + new.count("\n"))
        )

    def _insert(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        line = arguments.get("insert_line")
        new = arguments.get("insert_text", arguments.get("new_str"))
        if not isinstance(line, int) or isinstance(line, bool) or not isinstance(new, str):
            return ToolResult("insert needs insert_line (a line number, 0 for the top) and insert_text.", BAD_CALL)
        lines = self.files[name].splitlines(keepends=True)
        if not 0 <= line <= len(lines):
            return ToolResult(
                f"insert_line {line} is outside {ROOT}/{name}, which has {len(lines)} lines (use 0 to {len(lines)}).",
                NOT_APPLIED,
            )
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        block = new if new.endswith("\n") else new + "\n"
        self._write(name, "".join(lines[:line]) + block + "".join(lines[line:]))
        return ToolResult(
            f"The file {ROOT}/{name} has been edited. The result around the insertion:\n"
            + self._snippet(name, line + 1, line + block.count("\n"))
        )

    def _create(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        text = arguments.get("file_text")
        if not isinstance(text, str):
            return ToolResult(f"create needs file_text: the whole new content of {self.name}.", BAD_CALL)
        self._write(name, text)
        return ToolResult(f"{ROOT}/{name} now holds the given text ({len(text.splitlines())} lines).")

    def _undo_edit(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        if not self._undo:
            return ToolResult(f"There is no edit of {ROOT}/{name} to undo.", NOT_APPLIED)
        self.files[name] = self._undo.pop()
        return ToolResult(f"The last edit of {ROOT}/{name} was undone.")

    # --- helpers -----------------------------------------------------------------------------------
    def _write(self, name: str, text: str) -> None:
        self._undo.append(self.files[name])
        self.files[name] = text

    def _resolve(self, path: str) -> str | None:
        """The file a path names ('' for the workspace itself), or None: accepts /repo/train.py,
        train.py, ./train.py and /train.py (and so for every file)."""
        p = path.strip()
        if p in ("", ".", "/", ROOT, ROOT + "/"):
            return ""
        for prefix in (ROOT + "/", "./", "/"):
            if p.startswith(prefix):
                p = p[len(prefix) :]
                break
        return p if p in self.files else None

    def _snippet(self, name: str, first: int, last: int, context: int = 4) -> str:
        lines = self.files[name].splitlines()
        return _numbered(lines, max(1, first - context), min(len(lines), last + context))


def _numbered(lines: list[str], start: int, end: int) -> str:
    return "\n".join(f"{i:6}\t{lines[i - 1]}" for i in range(start, end + 1))


def _find_all(text: str, part: str) -> list[int]:
    found, at = [], text.find(part)
    while at != -1:
        found.append(at)
        at = text.find(part, at + 1)
    return found
