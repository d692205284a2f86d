"""The agent's own thread: bot.loop.proposals asks for a proposal and collects the answer on a later
tick, so a slow model never holds up collecting results or dispatching runs.

One question at a time, each on a fresh daemon thread. Whatever the agent does (returns a
proposal, returns anything else, raises anything at all, or takes longer than `timeout_s`) becomes
an answer: a Proposal or an exception. A question that timed out is abandoned: what it returns
later is ignored, and no new question starts while its thread still runs, so an agent is never
asked twice at once (a stateful agent stays consistent; a paid one is not billed twice).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from bot.core.protocols import Agent
from bot.core.records import Proposal, ProposalContext


class AgentTimeout(TimeoutError):
    """The agent did not answer within its time limit."""


class AgentWorker:
    def __init__(self, agent: Agent, *, timeout_s: float, clock: Callable[[], float] = time.time) -> None:
        self.agent = agent
        self.timeout_s = timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._asked: tuple[int, int, float] | None = None  # (experiment id, question number, asked at)
        self._answer: tuple[int, Proposal | BaseException] | None = None
        self._questions = 0
        self._notify: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None

    def on_answer(self, callback: Callable[[], None]) -> None:
        self._notify = callback

    def ask(self, exp_id: int, context: ProposalContext) -> None:
        """Start thinking about `exp_id` (nothing happens while an abandoned question still runs)."""
        if self._thread is not None:
            self._thread.join(timeout=0.05)  # a thread that just answered is about to end
            if self._thread.is_alive():
                return
        with self._lock:
            self._questions += 1
            number = self._questions
            self._asked = (exp_id, number, self.clock())
            self._answer = None
        self._thread = threading.Thread(
            target=self._think, args=(exp_id, number, context), daemon=True, name=f"agent-{exp_id}"
        )
        self._thread.start()

    def busy(self, exp_id: int) -> bool:
        """True while a question about `exp_id` is open, or an abandoned one still runs."""
        with self._lock:
            if self._asked is not None and self._asked[0] == exp_id:
                return True
        return self._thread is not None and self._thread.is_alive()

    def answer(self, exp_id: int) -> Proposal | BaseException | None:
        """The answer about `exp_id` once there is one (given out once), else None."""
        with self._lock:
            if self._asked is not None and self._asked[0] == exp_id and self.clock() - self._asked[2] > self.timeout_s:
                self._asked = None  # abandon it: a late answer is ignored
                return AgentTimeout(f"no proposal after {self.timeout_s:.0f}s")
            if self._answer is not None and self._answer[0] == exp_id:
                answer = self._answer[1]
                self._answer = None
                return answer
        return None

    def _think(self, exp_id: int, number: int, context: ProposalContext) -> None:
        try:
            answer: Proposal | BaseException = self.agent.propose(context)
            if not isinstance(answer, Proposal):
                answer = TypeError(f"the agent returned {type(answer).__name__}, not a Proposal")
        except BaseException as error:  # noqa: BLE001 - every failure of the agent is an answer
            answer = error
        with self._lock:
            if self._asked is None or self._asked[1] != number:
                return  # abandoned, or superseded by a newer question
            self._asked = None
            self._answer = (exp_id, answer)
        if self._notify is not None:
            self._notify()
