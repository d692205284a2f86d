"""The supervisor's side of the scoring process (runner.score): started with the training process,
it gets ready meanwhile (torch, the validation split, the tokenizer) and waits for `go`; once the
model is handed over, `score` says `go` and reads its one-line JSON answer within a time limit.

The process itself is built by the supervisor (its sandbox, environment and limits are the run's);
this class owns its lifetime: the ready signal, its stderr, and the answer.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from runner import processes

READY_LINE = "[score] ready"
ERROR_LINES = 20  # the last lines of its stderr kept, for the error of a scorer that failed


class ScoreProcess:
    def __init__(self, spawn: Callable[[], subprocess.Popen[str]]) -> None:
        self._spawn = spawn
        self.ready = threading.Event()
        self.proc: subprocess.Popen[str] | None = None
        self._errors: list[str] = []
        self._drain: threading.Thread | None = None

    def start(self) -> None:
        proc = self.proc = processes.started(self._spawn())
        self.ready.clear()
        self._errors = []
        self._drain = threading.Thread(target=self._read_stderr, args=(proc,), daemon=True)
        self._drain.start()

    def _read_stderr(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith(READY_LINE):
                self.ready.set()
            else:
                self._errors = (self._errors + [line.rstrip("\n")])[-ERROR_LINES:]

    def score(self, limit_s: float) -> tuple[dict[str, Any], float]:
        """Say `go` and read the answer within `limit_s`: (the answer, or {"error": why}; seconds it took)."""
        if self.proc is None or self.proc.poll() is not None:  # it died while it waited: start afresh
            self.start()
        scorer = self.proc
        assert scorer is not None and scorer.stdin is not None and scorer.stdout is not None
        started = time.time()
        answer_lines: list[str] = []
        reader = threading.Thread(target=lambda: answer_lines.extend(scorer.stdout or ()), daemon=True)
        reader.start()
        try:
            scorer.stdin.write("go\n")
            scorer.stdin.close()
        except BrokenPipeError:
            pass  # it had already died: its exit code and errors say how
        try:
            scorer.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            processes.kill_group(scorer.pid)
            scorer.wait()
            return {"error": f"scoring took longer than {limit_s:.0f} s and was stopped"}, time.time() - started
        seconds = time.time() - started
        reader.join(timeout=10)
        if self._drain is not None:
            self._drain.join(timeout=10)
        lines = "".join(answer_lines).strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if lines else {}
        except ValueError:
            answer = {}
        if not isinstance(answer, dict) or not answer:
            tail = "\n".join(self._errors)
            return {"error": f"the scoring process failed (exit code {scorer.returncode}): {tail}"}, seconds
        return answer, seconds
