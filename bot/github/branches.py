"""When an experiment gets its branch on GitHub: when something that reads the branch needs it.

A branch costs two of GitHub's 500 writes an hour (its ref, the PUT of its file), and each rebase
three more (a tree, a commit, the ref: bot.github.forge). At 16 runners a keep comes every ten
experiments or so, and the proposals queued behind busy runners were each rebased before they
ran. So the branch policy (bot.core.protocols.BranchPolicy) asks who reads the branch:

- The Actions runner checks out the job's commit: with it, every experiment's branch is pushed
  when it is proposed, as before.
- A runner that carries the asset in its job (local, Modal) never reads it; people do, through the
  pull request. So the branch is pushed once a run of the experiment has started (its pull request
  then shows it running), and a proposal that a keep overtakes while it waits for a runner is
  re-grafted onto the new main in memory (bot.loop.lifecycle), not rebased on GitHub.
- While the write budget is degraded (bot.github.budget), the publisher opens pull requests only
  for promising and kept experiments; the others get no branch either (two writes each saved). They
  are listed in the research log with their change, not a commit (bot.github.summaries). A kept
  one always gets its branch: main takes its commit. One whose run started while the mode was
  degraded stays without a branch when the mode turns full again, unless it turns promising:
  pushing every one in flight at once would weigh in the forecast as a burst of experiments and
  send the mode straight back (and they would get no pull request meanwhile). A restart forgets which were left so, and when (the forecast
  does not count them for an hour); if it finds the mode degraded, those in flight, started and
  without a branch, are told again (`left_unbranched`), so none is pushed in a burst then either.
"""

from __future__ import annotations

from collections.abc import Iterable

from bot.github.budget import WriteBudget

__all__ = ["BudgetBranches"]


class BudgetBranches:
    """The branch policy of a GitHub-connected bot (see the module docstring)."""

    def __init__(self, budget: WriteBudget, *, runner_reads_branch: bool) -> None:
        self.budget = budget
        self.runner_reads_branch = runner_reads_branch  # the Actions runner checks out the job's commit
        self._unbranched: dict[int, float | None] = {}  # left without a branch -> when the budget was told

    def left_unbranched(self, experiment_ids: Iterable[int]) -> None:
        """Experiments a former life left without a branch (in flight, a run of them started): they
        stay so unless promising. Not told to the forecast again: it would count them as new."""
        for experiment_id in experiment_ids:
            self._unbranched.setdefault(experiment_id, None)

    def wanted(self, experiment_id: int, *, started: bool, promising: bool) -> bool:
        if self.runner_reads_branch:
            return True
        if promising:
            noted = self._unbranched.pop(experiment_id, None)
            if noted is not None:  # its branch is counted as a write now
                self.budget.forget_unbranched(noted)
            return True
        if experiment_id in self._unbranched or not started:
            return False
        if self.budget.mode.mode == "degraded":  # the push it withholds: one that started
            self._unbranched[experiment_id] = self.budget.note_unbranched()
            return False
        return True
