"""The names of every state an experiment or a run can be in, and the moves allowed between them.

The conductor decides the moves; the store refuses any move not listed here, so a bug shows up as
a clear error at the transition instead of as a strange row later.

    proposing --agent answers, proposal valid-->  proposed --push branch (or not yet: the branch policy)-->  branched
    branched  --queue a run-->  measuring
    measuring --judge-->  measuring (confirmation) | rebasing | merging | closing
    rebasing  --graft train.py onto the new main (without a branch: in memory), queue a re-measure-->
              measuring | closing
    merging   --push its branch if not yet, move main to it (expected sha)-->  closing | rebasing (main moved)
    closing   --mark the branch closed (if pushed)-->  done
    any active state --the same step failed too often-->  done (status failed)
    any active state --a person closed its pull request or said /discard-->  closing (cancelled, discard)
    done      --a person reopened its pull request or said /rerun-->  branched (measured afresh)
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PROPOSING = "proposing"
    PROPOSED = "proposed"
    BRANCHED = "branched"
    MEASURING = "measuring"
    REBASING = "rebasing"
    MERGING = "merging"
    CLOSING = "closing"
    DONE = "done"


class Status(StrEnum):
    KEEP = "keep"
    DISCARD = "discard"
    CRASH = "crash"  # its run crashed or ran out of time
    REJECTED = "rejected"  # its run was refused a number: the evaluator's gate, or training's harness
    FAILED = "failed"
    CANCELLED = "cancelled"  # a person closed its pull request


NO_NUMBER = (Status.CRASH, Status.REJECTED)  # ended without a number: its run crashed or was rejected


class Request(StrEnum):
    """What a person asked for on one experiment; the conductor acts on it at its next tick."""

    CANCEL = "cancel"  # its pull request was closed by a person: stop its runs, end it as cancelled
    REOPEN = "reopen"  # its pull request was reopened: measure it again
    RERUN = "rerun"  # /rerun or the Re-run button: one more run (a finished one is measured afresh)
    KEEP = "keep"  # /keep or Keep anyway: merge it once measured on the current main, whatever the judge says
    DISCARD = "discard"  # /discard or Discard: stop its runs, end it as discarded


TRANSITIONS: dict[State, set[State]] = {
    State.PROPOSING: {State.PROPOSED},
    State.PROPOSED: {State.BRANCHED},
    State.BRANCHED: {State.MEASURING, State.CLOSING},
    State.MEASURING: {State.MEASURING, State.REBASING, State.MERGING, State.CLOSING},
    State.REBASING: {State.MEASURING, State.CLOSING},
    State.MERGING: {State.CLOSING, State.REBASING},
    State.CLOSING: {State.DONE},
    State.DONE: {State.BRANCHED},  # reopened by a person
}
for _state in State:  # any step that keeps failing ends its experiment as failed
    if _state is not State.DONE:
        TRANSITIONS[_state].add(State.DONE)

ACTIVE = tuple(s.value for s in State if s is not State.DONE)


class RunState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"  # finished with a result that counts (ok, crash or rejected)
    LOST = "lost"  # the runner lost it (a restart, a vanished machine): re-run
    REFUSED = "refused"  # its result did not match its job: never counts, re-run
    DISTURBED = "disturbed"  # it ran on a busy machine (far less CPU than main's runs got): re-run
    CANCELLED = "cancelled"  # stopped on purpose (its experiment moved on)


SET_ASIDE = (RunState.LOST, RunState.REFUSED, RunState.DISTURBED, RunState.CANCELLED)
