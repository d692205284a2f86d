"""Runs one job of a workflow file the way a self-hosted runner would, for the Actions emulator:
`${{ }}` expressions (the contexts inputs, github, vars, env, runner, secrets; the operators
||, &&, ==, !=, ! and parentheses; fromJSON, toJSON, always, success, failure, cancelled), step
`if:` conditions, `run:` steps in bash, `$GITHUB_ENV`, and the two actions the autoresearch
workflow uses: actions/checkout (the commit's tree from the stand-in's git) and
actions/upload-artifact (a zip of the listed paths, attached to the run).

What a real runner does that this does not: matrices, services, containers, job outputs,
`needs`, `timeout-minutes`, shells other than bash, and every other action.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUS_FUNCTIONS = ("always(", "success(", "failure(", "cancelled(")
_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?)|(?P<op>\|\||&&|==|!=|<=|>=|[!()<>,])"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_*][A-Za-z0-9_-]*)*))"
)


class ExpressionError(ValueError):
    """A `${{ }}` expression the emulator cannot read."""


# expressions -----------------------------------------------------------------------------------


def truthy(value: Any) -> bool:
    return value not in (None, False, 0, "", -0.0)


def as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()  # GitHub compares strings ignoring case
    return a == b


class Expression:
    """One expression over `contexts`; `status` answers always/success/failure/cancelled."""

    def __init__(self, text: str, contexts: dict[str, Any], status: Callable[[str], bool]):
        self.tokens = self._lex(text)
        self.at = 0
        self.contexts, self.status = contexts, status

    @staticmethod
    def _lex(text: str) -> list[tuple[str, str]]:
        tokens, at = [], 0
        while text[at:].strip():
            match = _TOKEN.match(text, at)
            if match is None:
                raise ExpressionError(f"cannot read {text[at:]!r}")
            kind = match.lastgroup
            assert kind is not None
            tokens.append((kind, match.group(kind)))
            at = match.end()
        return tokens

    def evaluate(self) -> Any:
        value = self._or()
        if self.at != len(self.tokens):
            raise ExpressionError(f"unexpected {self.tokens[self.at][1]!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise ExpressionError("the expression ends too early")
        token = self.tokens[self.at]
        if expected is not None and token[1] != expected:
            raise ExpressionError(f"expected {expected!r}, found {token[1]!r}")
        self.at += 1
        return token

    def _or(self) -> Any:
        value = self._and()
        while self._peek() == "||":
            self._take()
            other = self._and()
            value = value if truthy(value) else other
        return value

    def _and(self) -> Any:
        value = self._compare()
        while self._peek() == "&&":
            self._take()
            other = self._compare()
            value = other if truthy(value) else value
        return value

    def _compare(self) -> Any:
        value = self._unary()
        while self._peek() in ("==", "!="):
            op = self._take()[1]
            other = self._unary()
            value = _equal(value, other) if op == "==" else not _equal(value, other)
        return value

    def _unary(self) -> Any:
        if self._peek() == "!":
            self._take()
            return not truthy(self._unary())
        return self._primary()

    def _primary(self) -> Any:
        kind, text = self._take()
        if text == "(":
            value = self._or()
            self._take(")")
            return value
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text) if "." in text else int(text)
        if kind != "name":
            raise ExpressionError(f"unexpected {text!r}")
        if text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        if self._peek() == "(":
            self._take("(")
            args = []
            while self._peek() != ")":
                args.append(self._or())
                if self._peek() == ",":
                    self._take(",")
            self._take(")")
            return self._call(text, args)
        value: Any = self.contexts
        for part in text.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    def _call(self, name: str, args: list[Any]) -> Any:
        lowered = name.lower()
        if lowered in ("always", "success", "failure", "cancelled"):
            return self.status(lowered)
        if lowered == "fromjson":
            return json.loads(as_text(args[0]))
        if lowered == "tojson":
            return json.dumps(args[0])
        raise ExpressionError(f"the emulator has no function {name}()")


def evaluate(text: str, contexts: dict[str, Any], status: Callable[[str], bool] = lambda _: True) -> Any:
    return Expression(text, contexts, status).evaluate()


def substitute(value: Any, contexts: dict[str, Any]) -> Any:
    """A workflow value with its `${{ }}` expressions filled in; a value that is one expression
    only keeps the expression's type (runs-on may be a list)."""
    if not isinstance(value, str):
        return value
    whole = re.fullmatch(r"\s*\$\{\{(.*?)\}\}\s*", value, re.DOTALL)
    if whole:
        return evaluate(whole.group(1), contexts)
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: as_text(evaluate(m.group(1), contexts)), value, flags=re.DOTALL)


def condition(text: Any, contexts: dict[str, Any], status: Callable[[str], bool]) -> bool:
    """A step's `if:`; without a status function it means `success() && (...)`, as on GitHub."""
    if text is None:
        return status("success")
    if isinstance(text, bool):
        return text and status("success")
    source = str(text).strip()
    whole = re.fullmatch(r"\$\{\{(.*)\}\}", source, re.DOTALL)
    source = whole.group(1) if whole else source
    if not any(f in source.replace(" ", "") for f in STATUS_FUNCTIONS):
        source = f"success() && ({source})"
    return truthy(evaluate(source, contexts, status))


# running a job ---------------------------------------------------------------------------------


@dataclass
class JobRun:
    """What the runner needs to run one job: the parsed workflow, the contexts, the machine's
    environment, and the stand-in's side (checkout, upload, cancellation)."""

    workflow: dict[str, Any]
    contexts: dict[str, Any]  # github, inputs, vars, runner, secrets (env is filled in as it goes)
    workspace: Path
    machine_env: dict[str, str]
    checkout: Callable[[str, Path], None]  # (ref, destination): materialise a commit's tree
    upload: Callable[[str, bytes], None]  # (name, zip bytes): attach an artifact to the run
    cancelled: Callable[[], bool]
    log: list[str] = field(default_factory=list)
    failed: bool = False

    def status(self, name: str) -> bool:
        if name == "always":
            return True
        if name == "cancelled":
            return self.cancelled()
        if name == "failure":
            return self.failed
        return not self.failed and not self.cancelled()

    def run(self) -> str:
        """Run the first job's steps; the conclusion (success, failure or cancelled)."""
        job = next(iter(self.workflow.get("jobs", {}).values()))
        env: dict[str, str] = {}
        for scope in (self.workflow.get("env") or {}, job.get("env") or {}):
            env.update({k: as_text(substitute(v, {**self.contexts, "env": env})) for k, v in scope.items()})
        self.workspace.mkdir(parents=True, exist_ok=True)
        for number, step in enumerate(job.get("steps") or [], 1):
            contexts = {**self.contexts, "env": env}
            name = step.get("name") or step.get("uses") or f"step {number}"
            if not condition(step.get("if"), contexts, self.status):
                self.log.append(f"## {name}: skipped")
                continue
            self.log.append(f"## {name}")
            try:
                step_env = {**env, **{k: as_text(substitute(v, contexts)) for k, v in (step.get("env") or {}).items()}}
                ok = self._uses(step, contexts) if "uses" in step else self._run(step, contexts, step_env, env)
            except Exception as error:  # noqa: BLE001 - a step the emulator cannot carry out fails, as on GitHub
                self.log.append(f"error: {error}")
                ok = False
            if not ok and not step.get("continue-on-error"):
                self.failed = True
        if self.cancelled():
            return "cancelled"
        return "failure" if self.failed else "success"

    def _run(
        self, step: dict[str, Any], contexts: dict[str, Any], step_env: dict[str, str], env: dict[str, str]
    ) -> bool:
        script = substitute(step["run"], contexts)
        with tempfile.TemporaryDirectory(prefix="step-") as scratch:
            path, github_env = Path(scratch) / "step.sh", Path(scratch) / "github_env"
            path.write_text(script)
            github_env.touch()
            full_env = {**self.machine_env, **step_env, "GITHUB_ENV": str(github_env)}
            cwd = self.workspace / substitute(step.get("working-directory", "."), contexts)
            # The step's output goes to a file, read once the step has ended: no reader thread to
            # wait for (with a pipe, a reader joined with a timeout loses the log on a busy machine,
            # and a process the step left behind holding the pipe would keep it open).
            output = Path(scratch) / "output"
            with output.open("wb") as sink:
                proc = subprocess.Popen(
                    ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)],
                    cwd=cwd,
                    env=full_env,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._follow(proc)
            self.log.append(output.read_bytes().decode(errors="replace"))
            env.update(_read_github_env(github_env.read_text()))
        if proc.returncode != 0:
            self.log.append(f"Error: Process completed with exit code {proc.returncode}.")
        return proc.returncode == 0

    def _follow(self, proc: subprocess.Popen[bytes]) -> None:
        """Wait for the step's process to end; a cancelled run has its process group ended."""
        while True:
            try:
                proc.wait(timeout=0.05)
                return
            except subprocess.TimeoutExpired:
                if self.cancelled():
                    _end_group(proc)
                    proc.wait()
                    return

    def _uses(self, step: dict[str, Any], contexts: dict[str, Any]) -> bool:
        action = step["uses"].split("@")[0]
        given = {k: as_text(substitute(v, contexts)) for k, v in (step.get("with") or {}).items()}
        if action == "actions/checkout":
            self.checkout(given.get("ref") or contexts["github"]["sha"], self.workspace)
            return True
        if action == "actions/upload-artifact":
            return self._upload(given)
        raise RuntimeError(f"the stand-in does not emulate the action {step['uses']}")

    def _upload(self, given: dict[str, str]) -> bool:
        """upload-artifact@v4: the files found, stored relative to their least common ancestor."""
        paths = [line.strip() for line in given.get("path", "").splitlines() if line.strip()]
        found = [self.workspace / p for p in paths if (self.workspace / p).is_file()]
        if not found:
            how = given.get("if-no-files-found", "warn")
            self.log.append(
                f"{'Error' if how == 'error' else 'Warning'}: No files were found with the "
                f"provided path: {' '.join(paths)}. No artifacts will be uploaded."
            )
            return how != "error"
        root = Path(os.path.commonpath([f.parent for f in found]))
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in found:
                archive.write(file, file.relative_to(root).as_posix())
        self.upload(given.get("name") or "artifact", buffer.getvalue())
        return True


def _read_github_env(text: str) -> dict[str, str]:
    """`NAME=value` lines and `NAME<<DELIMITER` blocks, as the runner reads $GITHUB_ENV."""
    out: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            block = []
            for inner in lines:
                if inner == delimiter:
                    break
                block.append(inner)
            out[name] = "\n".join(block)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return out


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the step's process group, as the runner does on cancel."""
    for sig, grace in ((signal.SIGINT, 7.5), (signal.SIGTERM, 2.5), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace or None)
            return
        except subprocess.TimeoutExpired:
            continue
