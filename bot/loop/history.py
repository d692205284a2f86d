"""What the agent is told of the experiments so far, kept in memory: the history with each
experiment's lesson, and the code hashes a proposal must not repeat.

The history (every proposed experiment, not those the agent is still proposing) and every run's
code hash are brought up to date with only the experiments and runs written since the last
question: asking costs about the same at experiment 1000 as at 10.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.core.records import HistoryEntry
from bot.core.states import State, Status
from bot.store import Experiment, Store


@dataclass(frozen=True)
class _Known:
    """One proposed experiment as the agent is told of it, with what the proposal checks need."""

    entry: HistoryEntry
    state: str
    code_hash: str | None
    has_asset: bool
    fixes: object  # meta["fixes"]: the crashed experiment it claims to fix, if any


def _known(e: Experiment) -> _Known:
    entry = HistoryEntry(
        id=e.id,
        title=e.title,
        hypothesis=e.hypothesis,
        status=e.status or "running",
        val_bpb=e.val_bpb,
        delta=e.delta,
        code_hash=e.code_hash or "",
        meta=e.meta,
        error_tail=e.error_tail,
        margin=e.margin,
        lesson=_lesson(e.reason),
    )
    return _Known(entry, e.state, e.code_hash, e.asset is not None, e.meta.get("fixes"))


class History:
    """Every proposed experiment (not those the agent is still proposing) and every run's code
    hash, held in memory. refresh() reads only what was written since it last did: the experiments
    bot.store.experiments counts as written since, and the runs with higher ids. Its entries are
    shared by the contexts given to the agent, which only reads them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._version: int | None = None  # the experiments' write count it reflects; None: read them all
        self._known: dict[int, _Known] = {}
        self._last_run = 0  # the highest run id whose code hash is in _run_hashes
        self._run_hashes: set[str] = set()

    def refresh(self) -> None:
        experiments = self.store.experiments
        version = experiments.version
        if self._version is None:
            self._known = {e.id: _known(e) for e in experiments.all()}
            self._last_run, self._run_hashes = 0, set()
        else:
            changed = experiments.changed_since(self._version)
            fresh = {e.id: e for e in experiments.several(changed) if e.state != State.PROPOSING}
            top = next(reversed(self._known), 0)
            unordered = any(exp_id < top and exp_id not in self._known for exp_id in fresh)
            for exp_id in changed - fresh.keys():
                self._known.pop(exp_id, None)
            for exp_id in sorted(fresh):
                self._known[exp_id] = _known(fresh[exp_id])
            if unordered:  # a new entry below the highest id: put it in its place
                self._known = dict(sorted(self._known.items()))
        for run_id, code in experiments.run_code_hashes(after=self._last_run):
            self._run_hashes.add(code)
            self._last_run = run_id
        # what is read inside a transaction may yet be rolled back: read it all again next time
        self._version = None if self.store.db.in_transaction else version

    def entries(self) -> list[HistoryEntry]:
        """In id order."""
        return [k.entry for k in self._known.values()]

    def seen_hashes(self) -> set[str]:
        """The hash of every train.py proposed or run."""
        return {k.code_hash for k in self._known.values() if k.code_hash is not None} | self._run_hashes

    def codes(self) -> list[tuple[int, str, str]]:
        """(id, title, code_hash) of every experiment with a proposed train.py, in id order."""
        return [
            (k.entry.id, k.entry.title, k.code_hash)
            for k in self._known.values()
            if k.code_hash is not None and k.has_asset
        ]

    def unfixed_crash(self) -> HistoryEntry | None:
        """The latest finished experiment if it crashed (or was rejected) and no experiment yet
        claims to fix it: its traceback (or the rejection's reason) goes to the agent, so that one
        fix is tried, once."""
        last = next((k for k in reversed(self._known.values()) if k.state == State.DONE), None)
        if last is None or last.entry.status not in (Status.CRASH, Status.REJECTED):
            return None
        return None if any(k.fixes == last.entry.id for k in self._known.values()) else last.entry


def _lesson(reason: str | None, limit: int = 160) -> str:
    """One line of why an experiment ended as it did: the first sentence of its reason."""
    line = (reason or "").strip().splitlines()[0] if (reason or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
