"""One evaluation of a router: its sandboxed process, the protocol, the gate and the metric.

`evaluate_router` writes router.py and the training split into WORKDIR/box and starts the host
(host.py) on them in a sandbox (runner.sandbox) that sees that directory read-only and nothing of
the hold-out, the cache or the evaluator's other files (the package's vendored sample is hidden:
runner.sandbox's `hide`). The host trains the router, then the evaluator sends the hold-out's texts
one batch at a time and reads the queues back. Every answer passes the gate before it counts: an
answer for every ticket of its batch, each a queue of the training split; anything else (an unknown
queue, a wrong count, a line that is not an answer) ends the evaluation `rejected` with the reason.
The evaluator computes the metric itself, accuracy on the hold-out; the router never reports it.

The router's process has a time box (wall seconds for start-up, train() and every batch together):
past it, it is stopped with everything it started (`timeout`). Its processes get the run's limits
as train.py's do (runner.limits): private memory and file size by the kernel, tasks in the sandbox,
and about once a second the evaluator's look at the whole tree (memory, tasks, the unsandboxed
scratch directory), which stops a router past one as a `crash` naming it; an exception in train()
or route(), or an early end, is a `crash` whose error is its traceback's tail. Its stderr and
whatever it prints go to WORKDIR/log.txt (capped, runner.run_log). Without a usable bubblewrap it
runs unsandboxed, with a warning in the log and `sandboxed: false`: it can then read what the user
running it can, the hold-out labels in the cache included.
"""

from __future__ import annotations

import json
import os
import queue
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import files, limits, processes, run_log, sandbox
from runner.tasks import Evaluation
from runner.tasks.ticket_routing.tickets import SAMPLE_DIR, Ticket

HOST = Path(__file__).parent / "host.py"
ANSWER_BYTES = 1 << 20  # the longest line of the host read as one answer
EXIT_GRACE_S = 5.0  # after the last answer, how long the host may take to end before it is stopped
LIMITS_EVERY_S = 1.0  # how often the evaluator looks at the router's process tree (runner.limits.crossed)
ASSET = "router.py"


@dataclass(frozen=True)
class Scale:
    time_box_s: float  # wall seconds for the router's process: start-up, train() and every batch
    batch_size: int  # hold-out tickets sent at once


SCALES = {"smoke": Scale(time_box_s=60.0, batch_size=24), "cpu": Scale(time_box_s=300.0, batch_size=64)}


class _Stop(Exception):
    """The evaluation ends here, as this Evaluation (the gate's verdict, a crash, the time box)."""

    def __init__(self, status: str, error: str) -> None:
        super().__init__(error)
        self.status, self.error = status, error


def evaluate_router(
    asset: str,
    train: list[Ticket],
    holdout: list[Ticket],
    workdir: Path,
    *,
    scale: Scale,
    seed: int = 0,
    use_sandbox: bool | None = None,
) -> Evaluation:
    """Train the router in `asset` on `train` and measure its accuracy on `holdout` (see the module
    docstring). Never raises for a bad router."""
    started = time.monotonic()
    workdir = workdir.resolve()  # the sandbox binds absolute paths
    ok, why = sandbox.available() if use_sandbox is not False else (False, "turned off")
    box = _lay_out(workdir, asset, train)
    log = run_log.RunLog()
    log.open(workdir / "log.txt")
    if not ok:
        log.say(
            f"WARNING: running {ASSET} WITHOUT a sandbox: {why}. It can read every file this user can, "
            "the hold-out's labels in the cache included; the result is marked unsandboxed."
        )
    host = _Host(_command(workdir, box, seed, sandboxed=ok), log, workdir / "scratch")
    queues = {queue for _, queue in train}
    deadline = started + scale.time_box_s
    ready_at = time.monotonic()
    try:
        ready = host.answer(deadline, "while it started and train() ran", scale.time_box_s)
        if ready.get("ready") is not True:
            raise _Stop("rejected", _not_an_answer(ready, "its start (train())"))
        ready_at = time.monotonic()
        routed: list[str] = []
        batches = [holdout[at : at + scale.batch_size] for at in range(0, len(holdout), scale.batch_size)]
        for number, batch in enumerate(batches, 1):
            texts = [text for text, _ in batch]
            host.send({"texts": texts})
            where = f"at batch {number} of {len(batches)}"
            routed += _gate(host.answer(deadline, where, scale.time_box_s), texts, queues, where)
        host.finish()
    except BaseException as error:
        host.stop()  # whatever ends the evaluation, the router's process does not outlive it
        log.close()
        if not isinstance(error, _Stop):
            raise
        stop = error
        return Evaluation(
            status=stop.status,  # type: ignore[arg-type]
            error=stop.error,
            setup_s=ready_at - started,
            evaluation_s=time.monotonic() - ready_at,
            sandboxed=ok,
            log_tail=run_log.tail(workdir / "log.txt"),
        )
    log.close()
    truth = [queue for _, queue in holdout]
    correct = sum(answer == right for answer, right in zip(routed, truth, strict=True))
    return Evaluation(
        status="ok",
        value=correct / len(holdout),
        metrics={
            "correct": correct,
            "holdout_tickets": len(holdout),
            "train_tickets": len(train),
            "queues": len(queues),
            "batches": len(batches),
            "macro_f1": round(macro_f1(truth, routed), 6),
            "claimed_train_seconds": ready.get("train_seconds"),
            "time_box_s": scale.time_box_s,
        },
        setup_s=ready_at - started,
        evaluation_s=time.monotonic() - ready_at,
        sandboxed=ok,
        log_tail=run_log.tail(workdir / "log.txt"),
    )


def macro_f1(truth: list[str], routed: list[str]) -> float:
    """The mean over the true queues of each queue's F1 (a queue never right scores 0)."""
    hits = Counter(right for right, answer in zip(truth, routed, strict=True) if right == answer)
    sent, actual = Counter(routed), Counter(truth)
    scores = [2 * hits[queue] / (sent[queue] + actual[queue]) for queue in actual]
    return sum(scores) / len(scores) if scores else 0.0


def _gate(answer: dict[str, Any], texts: list[str], queues: set[str], where: str) -> list[str]:
    """The answer's labels if it routes every ticket of the batch to a known queue; else _Stop."""
    if "unreadable" in answer:
        raise _Stop("rejected", f"{ASSET}'s route() {where}: {answer['unreadable']}")
    labels = answer.get("labels")
    if not isinstance(labels, list):
        raise _Stop("rejected", _not_an_answer(answer, where))
    if len(labels) != len(texts):
        raise _Stop(
            "rejected",
            f"{ASSET}'s route() returned {len(labels)} queues for {len(texts)} tickets {where}: "
            "it must return one queue per ticket, in order",
        )
    for text, label in zip(texts, labels, strict=True):
        if not isinstance(label, str) or label not in queues:
            known = sorted(queues)
            shown = ", ".join(known[:12]) + (f" and {len(known) - 12} more" if len(known) > 12 else "")
            raise _Stop(
                "rejected",
                f"{ASSET}'s route() sent the ticket {text[:80]!r} to {label!r} {where}, which is not a queue of "
                f"the training split (its {len(known)} queues: {shown})",
            )
    return labels


def _not_an_answer(answer: dict[str, Any], where: str) -> str:
    try:
        shown = json.dumps(answer)[:200]
    except (ValueError, RecursionError):  # nested just past what json can write back (repr neither)
        shown = "a JSON value nested too deep to show"
    return (
        f"the router's process answered {where} with a line that is not the host's answer "
        f"({shown}): something wrote to the evaluator's channel"
    )


def _lay_out(workdir: Path, asset: str, train: list[Ticket]) -> Path:
    """WORKDIR/box with router.py and train.jsonl (what the sandbox sees) and WORKDIR/scratch (the
    unsandboxed process's TMPDIR)."""
    for name in ("box", "scratch"):
        shutil.rmtree(workdir / name, ignore_errors=True)
        (workdir / name).mkdir(parents=True)
    box = workdir / "box"
    files.write_text(box / ASSET, asset)
    files.write_text(box / "train.jsonl", "".join(json.dumps({"text": t, "queue": q}) + "\n" for t, q in train))
    for path in (box / ASSET, box / "train.jsonl"):
        os.chmod(path, 0o644)  # the sandbox's user (nobody) reads them
    os.chmod(box, 0o755)
    os.chmod(workdir / "scratch", 0o777)
    return box


@dataclass(frozen=True)
class _Command:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


def _command(workdir: Path, box: Path, seed: int, *, sandboxed: bool) -> _Command:
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(box),
        "TMPDIR": "/tmp" if sandboxed else str(workdir / "scratch"),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": str(seed % 2**32),  # a router iterating a set of strings repeats itself
    }
    argv = [sys.executable, "-I", str(HOST), str(box / ASSET), str(box / "train.jsonl")]
    if not sandboxed:
        return _Command(argv, env, box)
    # Every sandbox sees the runner package, and in it the vendored sample, whose labels are the
    # smoke profile's hold-out's: hidden.
    return _Command(sandbox.wrap(argv, sandbox.Sandbox(read=[box], env=env, cwd=box, hide=[SAMPLE_DIR])), env, box)


class _Host:
    """The host's process: its answers (one line each, read by a thread, waited for with a deadline),
    its stdin (written by a thread: a process that reads nothing cannot block the evaluator), its
    stderr into the log, and its tree's limits looked at while an answer is waited for."""

    def __init__(self, command: _Command, log: run_log.RunLog, scratch: Path) -> None:
        run_limits = limits.from_env()
        rlimits = limits.child_rlimits(run_limits, cuda=False)

        def child_setup() -> None:  # between fork and exec: system calls only
            for which, value in rlimits:
                resource.setrlimit(which, (value, value))

        self.limits, self.scratch = run_limits, scratch
        self._looked_at = time.monotonic()
        self.proc = processes.started(
            subprocess.Popen(
                command.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=command.env,
                cwd=command.cwd,
                start_new_session=True,
                preexec_fn=child_setup,
            )
        )
        self._answers: queue.Queue[bytes] = queue.Queue()
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        threads = [threading.Thread(target=work, daemon=True) for work in (self._read, self._write)]
        self._logging = threading.Thread(target=self._log, args=(log,), daemon=True)
        for thread in (*threads, self._logging):
            thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := self.proc.stdout.readline(ANSWER_BYTES):
            self._answers.put(line)
        self._answers.put(b"")

    def _write(self) -> None:
        assert self.proc.stdin is not None
        try:
            while (message := self._outbox.get()) is not None:
                self.proc.stdin.write(message)
                self.proc.stdin.flush()
            self.proc.stdin.close()
        except OSError:  # it ended: its answer (or its absence) says why
            pass

    def _log(self, log: run_log.RunLog) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(1 << 16), b""):  # type: ignore[union-attr]
            log.write(chunk)

    def send(self, message: dict[str, Any]) -> None:
        self._outbox.put((json.dumps(message) + "\n").encode())

    def answer(self, deadline: float, where: str, box_s: float) -> dict[str, Any]:
        """The next answer, or _Stop: the time box ran out, the process tree crossed a limit, the
        process ended, or train() or route() raised (their traceback)."""
        while True:
            self._check_limits(where)
            now = time.monotonic()
            try:
                line = self._answers.get(timeout=max(0.0, min(deadline - now, self._looked_at + LIMITS_EVERY_S - now)))
                break
            except queue.Empty:
                if time.monotonic() < deadline:
                    continue
                raise _Stop(
                    "timeout",
                    f"{ASSET} ran past its time box of {box_s:.0f} s (start-up, train() and route() on every "
                    f"hold-out batch together) and was stopped {where}",
                ) from None
        if not line:
            self.proc.wait()
            raise _Stop(
                "crash", f"the router's process ended {where} without an answer ({_exit(self.proc.returncode)})"
            )
        if len(line) >= ANSWER_BYTES and not line.endswith(b"\n"):
            raise _Stop("rejected", f"the router's process wrote a line longer than {ANSWER_BYTES} bytes {where}")
        try:
            answer = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: a line nested past the parser's depth
            answer = {"unparsed": line[:200].decode(errors="replace")}
        if not isinstance(answer, dict):
            answer = {"unparsed": answer}
        if "error" in answer:
            error = str(answer["error"])
            if "MemoryError" in error:
                error = f"{ASSET} ran out of memory: a run may hold {limits.describe(self.limits.memory)}. {error}"
            raise _Stop("crash", error)
        return answer

    def _check_limits(self, where: str) -> None:
        """_Stop (a crash naming the limit) when the router's tree crossed one; looks at most once
        every LIMITS_EVERY_S."""
        if time.monotonic() - self._looked_at < LIMITS_EVERY_S:
            return
        self._looked_at = time.monotonic()
        if self.proc.poll() is not None:  # it ended: its answers (or their absence) say why
            return
        why = limits.crossed(self.limits, self.proc.pid, self.scratch, spare=processes.managed(), asset=ASSET)
        if why:
            raise _Stop("crash", f"{why} (stopped {where})")

    def finish(self) -> None:
        """After the last answer: end of input, a moment to end, then everything it started stops."""
        self._outbox.put(None)
        try:
            self.proc.wait(EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        self.stop()

    def stop(self) -> None:
        """Stop it with everything it started; its stderr is in the log once this returns."""
        if self.proc.poll() is None:
            processes.kill_group(self.proc.pid)
            self.proc.wait()
        processes.kill_leftovers(self.proc.pid)
        self._outbox.put(None)
        self._logging.join(timeout=EXIT_GRACE_S)


def _exit(code: int | None) -> str:
    signum = processes.signal_of(code)
    return f"killed by signal {signum}" if signum is not None else f"exit code {code}"
