"""An experiment's branch: pushed when the branch policy wants it, and what the lifecycle does
without one.

The branch policy (bot.core.protocols.BranchPolicy) says when: by default at once; on GitHub with a
runner that carries the asset in its job, once a run of the experiment starts, and while the write
budget is degraded only for a promising one (bot.github.branches). Until then the experiment is
measured from the asset its runs carry, and re-grafted onto a newer main in memory (`regrafted`:
the 3-way merge a rebase makes, no forge call).

Three kinds of push, one call slot per experiment (("branch", id), bot.loop.forge_calls):
- `push(exp)`: the research needs it (at its proposal where the policy wants it then; a keep's,
  `inline`, on the conductor's own forge, since every slot waits for that merge). A failure is the
  experiment's step failing, as for any forge step.
- `push_wanted()`: each tick, the experiments in flight without a branch that the policy now wants.
  Only people read those: a failure is logged and tried again on a backoff of its own, and never
  charged to the experiment, whose runs and verdict go on.
- `before_close(exp)`: one that ended before its wanted branch was pushed gets it (people see its
  pull request), once; after a failed push it closes without, listed in the research log.
A push being made on the forge worker is always taken, whatever the policy says by then: a branch
made on GitHub is never left unrecorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from bot.core.merge import merge_text
from bot.core.protocols import BranchPolicy, Forge
from bot.core.states import RunState, State
from bot.loop.forge_calls import PENDING, ForgeWorker, InlineCalls
from bot.store import Experiment, Run, Store
from bot.store.runs import is_ahead

if TYPE_CHECKING:
    from bot.loop.baseline import Main
    from bot.loop.lifecycle import Backoff

log = logging.getLogger(__name__)


class Branching:
    def __init__(
        self,
        store: Store,
        forge: Forge,
        calls: InlineCalls | ForgeWorker,
        policy: BranchPolicy,
        *,
        asset: str,
        backoff: Backoff,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.forge = forge
        self.calls = calls
        self.policy = policy
        self.asset = asset  # the task's asset's path: train.py, or another task's
        self.backoff = backoff
        self.clock = clock
        self._failures: dict[int, tuple[int, float]] = {}  # experiment -> (failed pushes in a row, retry at)

    def waits_at_proposal(self, exp: Experiment) -> bool:
        """Whether the policy lets a new proposal go on without its branch."""
        return not self.policy.wanted(exp.id, started=False, promising=False)

    def push(self, exp: Experiment, *, inline: bool = False) -> Experiment | None:
        """Push the experiment's branch as it stands (one commit of its asset on its base) and record
        its head; None while the call is being made (bot.loop.forge_calls). A call made for an
        older base or asset is dropped by its key: the branch is pushed again as it stands now.
        `inline`: on this thread's forge, now (never None)."""
        branch, files = exp.branch, {self.asset: exp.asset}
        message = f"{exp.title}\n\n{exp.hypothesis}\n\nautoresearch-experiment: {exp.id}"

        def push(forge: Forge) -> str:
            return forge.create_branch(branch, exp.base_sha, files, message)

        head = push(self.forge) if inline else self.calls.call(("branch", exp.id, exp.base_sha, exp.code_hash), push)
        if head is PENDING:
            return None
        self._failures.pop(exp.id, None)
        return self.store.experiments.update(exp.id, head_sha=head, event=f"pushed {exp.branch} at {head[:7]}")

    def push_wanted(self) -> None:
        """Push the branch of each experiment in flight without one that the policy now wants (a run
        of it started, the judge asked to confirm it); where it is made off this thread, a later
        tick records it. A merge pushes its own, a close takes one still wanted (before_close)."""
        branchless = [
            e
            for e in self.store.experiments.active()
            if e.head_sha is None and e.state in (State.BRANCHED, State.MEASURING, State.REBASING)
        ]
        if not branchless:
            return
        runs = self.store.runs.of_experiments([e.id for e in branchless])
        for exp in branchless:
            if self._wanted(exp, runs.get(exp.id, [])):
                self._try_push(exp)

    def before_close(self, exp: Experiment) -> Experiment | None:
        """The experiment as it closes: with its branch pushed if the policy wants one (a run that
        ended before its push), a push in flight waited for (None meanwhile); without, after a
        failed push (listed in the research log rather than holding up its verdict)."""
        if exp.head_sha is None and self._wanted(exp, self.store.runs.all(experiment_id=exp.id)):
            if self.calls.holds(("branch", exp.id)) or exp.id not in self._failures:
                try:
                    pushed = self.push(exp)
                except Exception as error:  # noqa: BLE001 - the branch is for people: the verdict goes on
                    log.warning("experiment %s: pushing its branch failed (%s); closing without it", exp.id, error)
                    pushed = exp
                if pushed is None:
                    return None  # being made
                exp = pushed
        self._failures.pop(exp.id, None)
        return exp

    def regrafted(self, exp: Experiment, main: Main) -> str:
        """The experiment's asset re-grafted onto main without its branch: the 3-way merge a rebase
        makes (its base's text, main's, its own). Raises MergeConflict."""
        try:
            base = self.forge.read_file(exp.base_sha, self.asset)  # a main of this process: known, no read
        except FileNotFoundError:
            base = ""
        return merge_text(base, main.asset, exp.asset, path=self.asset, branch=exp.branch)

    def _wanted(self, exp: Experiment, runs: list[Run]) -> bool:
        """The policy's word on an experiment with these runs; yes, too, while a push of its branch is
        being made (asked for when the policy said yes): its result is taken, not lost."""
        if self.calls.holds(("branch", exp.id)):
            return True
        # a run ahead of a keep's merge measures its change on a main not there yet: no branch for it until then
        started = any(r.state not in (RunState.QUEUED, RunState.CANCELLED) and not is_ahead(r.base_sha) for r in runs)
        promising = any(r.purpose == "confirm" for r in runs)
        return self.policy.wanted(exp.id, started=started, promising=promising)

    def _try_push(self, exp: Experiment) -> Experiment | None:
        """A push people read: a failure logged and tried again after a backoff of its own, never
        charged to the experiment; None while it is being made, or waits, or failed."""
        failures, retry_at = self._failures.get(exp.id, (0, 0.0))
        if retry_at > self.clock():
            return None
        try:
            return self.push(exp)
        except Exception as error:  # noqa: BLE001 - the branch is for people: its experiment goes on
            wait = self.backoff.after(failures + 1)
            self._failures[exp.id] = (failures + 1, self.clock() + wait)
            log.warning("experiment %s: pushing its branch failed (%s); trying again in %.0fs", exp.id, error, wait)
            return None
