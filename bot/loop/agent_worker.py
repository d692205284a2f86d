"""The agent's own threads: bot.loop.proposals asks for proposals and collects the answers on later
ticks, so a slow model never holds up collecting results or dispatching runs.

Several questions may be open at once, one per experiment being proposed, each on a fresh daemon
thread with its own context; `ask` starts one only while fewer than its `limit` threads think.
Whatever the agent does with a
question (returns a proposal, returns anything else, raises anything at all, or takes longer than
`timeout_s`) becomes that question's answer: a Proposal or an exception. A question that timed out
is abandoned: what it returns later is ignored, and its thread still counts against the limit
until it ends, so a paid agent is never asked more questions at once than the limit (one that
hangs lowers the number the others may use, never stalls them). What it returns is kept only to be
paid for (`late_answers`): a paid agent bills an answer whether or not anyone still waits for it.
Each answer, and each abandoned thread that ends, calls the `on_answer` callback: the conductor's
driver ticks at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bot.core.protocols import Agent
from bot.core.records import Proposal, ProposalContext


class AgentTimeout(TimeoutError):
    """The agent did not answer within its time limit."""


@dataclass
class _Question:
    number: int  # tells a question from a newer one about the same experiment
    asked_at: float
    thread: threading.Thread
    answer: Proposal | BaseException | None = None


class AgentWorker:
    def __init__(self, agent: Agent, *, timeout_s: float, clock: Callable[[], float] = time.time) -> None:
        self.agent = agent
        self.timeout_s = timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[int, _Question] = {}  # experiment id -> its open question (answered or not)
        self._abandoned: dict[int, threading.Thread] = {}  # question number -> its thread, still running
        self._late: list[Proposal | BaseException] = []  # what abandoned questions answered, not yet paid for
        self._questions = 0
        self._notify: Callable[[], None] | None = None

    def on_answer(self, callback: Callable[[], None]) -> None:
        self._notify = callback

    def running(self) -> int:
        """Threads still thinking: open questions not yet answered and abandoned ones not yet ended."""
        with self._lock:
            return self._running()

    def unpaid(self) -> int:
        """Answers that may still cost what is not yet spent: questions thinking (abandoned ones
        included), answers not yet given out, and late answers not yet paid for."""
        with self._lock:
            return len(self._open) + len(self._abandoned) + len(self._late)

    def _running(self) -> int:
        return sum(1 for q in self._open.values() if q.answer is None) + len(self._abandoned)

    def ask(self, exp_id: int, context: ProposalContext, *, limit: int = 1) -> bool:
        """Start thinking about `exp_id`; False (nothing starts) while a question about it is open
        or `limit` threads are still thinking."""
        with self._lock:
            if exp_id in self._open or self._running() >= limit:
                return False
            self._questions += 1
            number = self._questions
            thread = threading.Thread(
                target=self._think, args=(exp_id, number, context), daemon=True, name=f"agent-{exp_id}-{number}"
            )
            self._open[exp_id] = _Question(number, self.clock(), thread)
        thread.start()
        return True

    def answered(self, exp_id: int) -> bool:
        """True when the question about `exp_id` has an answer not yet given out."""
        with self._lock:
            question = self._open.get(exp_id)
            return question is not None and question.answer is not None

    def remind(self) -> None:
        """Call the `on_answer` callback again: answers are waiting that the last tick left."""
        if self._notify is not None:
            self._notify()

    def busy(self, exp_id: int) -> bool:
        """True while a question about `exp_id` is open (its answer not yet given out)."""
        with self._lock:
            return exp_id in self._open

    def answer(self, exp_id: int) -> Proposal | BaseException | None:
        """The answer about `exp_id` once there is one (given out once), else None; an AgentTimeout
        once the question has been open longer than `timeout_s` (it is then abandoned)."""
        with self._lock:
            question = self._open.get(exp_id)
            if question is None:
                return None
            if question.answer is not None:
                del self._open[exp_id]
                return question.answer
            if self.clock() - question.asked_at > self.timeout_s:
                del self._open[exp_id]  # abandon it: a late answer is ignored
                self._abandoned[question.number] = question.thread
                return AgentTimeout(f"no proposal after {self.timeout_s:.0f}s")
        return None

    def late_answers(self) -> list[Proposal | BaseException]:
        """What abandoned questions answered since the last call (given out once): ignored as
        proposals, but what they cost is spent."""
        with self._lock:
            late, self._late = self._late, []
        return late

    def _think(self, exp_id: int, number: int, context: ProposalContext) -> None:
        try:
            answer: Proposal | BaseException = self.agent.propose(context)
            if not isinstance(answer, Proposal):
                answer = TypeError(f"the agent returned {type(answer).__name__}, not a Proposal")
        except BaseException as error:  # noqa: BLE001 - every failure of the agent is an answer
            answer = error
        with self._lock:
            question = self._open.get(exp_id)
            if question is not None and question.number == number:
                question.answer = answer
            else:  # abandoned: its answer is ignored but for its cost, and its place is free for another question
                self._abandoned.pop(number, None)
                self._late.append(answer)
        if self._notify is not None:
            self._notify()
