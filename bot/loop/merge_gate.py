"""The wait before a keep's merge: what people should see of a kept experiment before main takes it.

In full mode on GitHub that is its pull request (bot.github.publisher.pull_request_first), because
GitHub refuses a pull request for a branch main already holds, and publishing runs on its own
worker, which may not have opened it yet. The gate is a function the service passes in: it says
why a keep should wait (its pull request is not open yet) or None. The lifecycle asks `holds`
at its merging step, and the wait is bounded: a keep holds every run on the main it is about to
move, so after `wait_s` (MERGE_WAIT_S) main takes it anyway, with an event saying why, and what
people miss is the publisher's to show another way (its check on main's commit, a line in the
research log). Each keep is timed from when the gate first held it, in this process: a keep of
the same experiment after a rebase or after people had it measured again is timed anew.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from bot.store import Experiment, Store

log = logging.getLogger(__name__)

MERGE_WAIT_S = 60.0  # the longest a keep waits for its gate before main takes it anyway

Gate = Callable[[Experiment], "str | None"]  # why a kept experiment should not merge yet; None: go


class MergeWait:
    def __init__(self, store: Store, gate: Gate | None, *, clock: Callable[[], float], wait_s: float = MERGE_WAIT_S):
        self.store = store
        self.gate = gate
        self.clock = clock
        self.wait_s = wait_s
        self._since: dict[tuple[int, str, int], float] = {}  # (experiment, base, round) -> first held

    def holds(self, exp: Experiment) -> bool:
        """Whether the keep waits for now: while the gate says why, for at most `wait_s`."""
        why = self.gate(exp) if self.gate is not None else None
        keep = (exp.id, exp.base_sha, exp.reopened)
        for other in [k for k in self._since if k[0] == exp.id and k != keep]:
            del self._since[other]  # an earlier keep of it, left by a rebase or a reopen
        if why is None:
            self._since.pop(keep, None)
            return False
        if keep not in self._since:
            self._since[keep] = self.clock()
            log.info("experiment %s: the merge waits: %s", exp.id, why)
        if self.clock() - self._since[keep] < self.wait_s:
            return True
        del self._since[keep]
        log.warning("experiment %s: merged after %.0f s of waiting, though %s", exp.id, self.wait_s, why)
        self.store.experiments.update(exp.id, event=f"merged without waiting longer: {why}")
        return False
