"""The experiments table: each experiment's state, proposal and decision, and a person's request on it.

Every state change is checked against bot.core.states.TRANSITIONS here, so no caller can move an
experiment along a path the table does not list; a change and its event are one transaction, and
the crash tests' failpoint of the new state fires once it is committed. Every write to the table
goes through here and is counted (`version`), so a reader that keeps experiments in memory reads
again only those written since it last looked (`changed_since`), not the whole table.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from bot.core.states import ACTIVE, TRANSITIONS, State
from bot.store.db import Database
from bot.store.events import Events


class InvalidTransition(RuntimeError):
    """A move between states that bot.core.states does not allow: a bug in the caller."""


@dataclass
class Experiment:
    id: int
    state: str
    status: str | None
    title: str
    hypothesis: str
    branch: str | None
    code_hash: str | None
    asset: str | None  # the text of the edited file (train.py), once proposed
    meta: dict[str, Any]
    base_sha: str
    head_sha: str | None
    merged_sha: str | None
    val_bpb: float | None
    delta: float | None
    margin: float | None
    remeasured_delta: float | None
    reason: str | None
    error_tail: str | None
    failures: int
    retry_at: float | None
    created_at: float
    updated_at: float
    request: str | None = None  # a person's pending request (bot.core.states.Request), until acted on
    request_by: str | None = None
    reopened: int = 0  # how many times people had it measured again: each is a round shown anew


def experiment_of(row: sqlite3.Row) -> Experiment:
    data = dict(row)
    data["meta"] = json.loads(data["meta"])
    return Experiment(**data)


class Experiments:
    def __init__(self, db: Database, events: Events) -> None:
        self.db = db
        self.events = events
        self._written: list[int] = []  # the id of each experiment written through here, in order

    # --- what changed ----------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """How many writes this component has made since the store was opened: a reader that keeps
        experiments in memory notes it, then asks changed_since(it) what to read again."""
        return len(self._written)

    def changed_since(self, version: int) -> set[int]:
        """The ids of the experiments written since `version` (a deleted one among them). A write
        rolled back is still counted: reading its row again does no harm."""
        return set(self._written[version:])

    # --- the lifecycle -------------------------------------------------------------------------
    def start_proposing(self, base_sha: str) -> Experiment:
        """An experiment whose proposal the agent is working on, based on main `base_sha`."""
        now = time.time()
        with self.db.transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO experiments(state, base_sha, created_at, updated_at) VALUES ('proposing', ?, ?, ?)",
                (base_sha, now, now),
            )
            exp_id = cursor.lastrowid
            self._written.append(exp_id)
            self.events.add(exp_id, "proposing", f"asked the agent for a proposal on main {base_sha[:7]}")
        self.db.failpoint("proposing")
        return self.get(exp_id)

    def fill_proposal(
        self,
        exp_id: int,
        *,
        title: str,
        hypothesis: str,
        slug: str,
        code_hash: str,
        asset: str,
        meta: dict[str, Any],
        base_sha: str | None = None,
    ) -> Experiment:
        """Record a validated proposal (on main `base_sha`, when main moved since it was asked for);
        the branch name is fixed here, from the id."""
        moved = {"base_sha": base_sha} if base_sha else {}
        return self.update(
            exp_id,
            **moved,
            state=State.PROPOSED,
            title=title,
            hypothesis=hypothesis,
            branch=f"autoresearch/{exp_id}-{slug}",
            code_hash=code_hash,
            asset=asset,
            meta=meta,
            failures=0,
            event=title,
        )

    def withdraw_proposing(self, exp_id: int, why: str) -> None:
        """Forget an experiment the agent never proposed (it has no branch and no run)."""
        self._written.append(exp_id)
        with self.db.transaction() as conn:
            if conn.execute("DELETE FROM experiments WHERE id = ? AND state = 'proposing'", (exp_id,)).rowcount:
                self.events.add(None, "agent", f"no experiment {exp_id}: {why}")

    def update(self, exp_id: int, *, event: str | None = None, **fields: Any) -> Experiment:
        """Write fields (a state change among them, if TRANSITIONS allows it) and, optionally, an
        event in one transaction."""
        self._written.append(exp_id)
        if "meta" in fields:
            fields["meta"] = json.dumps(fields["meta"])
        fields["updated_at"] = time.time()
        columns = ", ".join(f"{name} = ?" for name in fields)
        with self.db.transaction() as conn:
            if "state" in fields:
                row = conn.execute("SELECT state FROM experiments WHERE id = ?", (exp_id,)).fetchone()
                if row is None:
                    raise KeyError(f"no experiment {exp_id}")
                old, new = State(row["state"]), State(fields["state"])
                if new not in TRANSITIONS[old]:
                    raise InvalidTransition(f"experiment {exp_id}: {old} -> {new} is not allowed")
            cursor = conn.execute(f"UPDATE experiments SET {columns} WHERE id = ?", (*fields.values(), exp_id))
            if cursor.rowcount != 1:
                raise KeyError(f"no experiment {exp_id}")
            if event:
                self.events.add(exp_id, str(fields.get("state", "update")), event)
        if "state" in fields:
            self.db.failpoint(str(fields["state"]))
        return self.get(exp_id)

    def request(self, exp_id: int, request: str, by: str) -> Experiment:
        """Record a person's request on an experiment (the latest one wins) for the conductor."""
        return self.update(exp_id, request=request, request_by=by, event=f"{by} asked for {request}")

    # --- reads ---------------------------------------------------------------------------------
    def get(self, exp_id: int) -> Experiment:
        row = self.db.execute("SELECT * FROM experiments WHERE id = ?", (exp_id,)).fetchone()
        if row is None:
            raise KeyError(f"no experiment {exp_id}")
        return experiment_of(row)

    def all(self) -> list[Experiment]:
        """Every experiment with a proposal (not those the agent is still proposing), in id order."""
        return self._select("WHERE state != 'proposing'")

    def several(self, ids: set[int]) -> list[Experiment]:
        """The experiments among `ids` that exist, those the agent is still proposing included, in id order."""
        wanted = sorted(ids)
        found: list[Experiment] = []
        for start in range(0, len(wanted), 500):  # an old SQLite takes at most 999 parameters
            chunk = wanted[start : start + 500]
            found += self._select(f"WHERE id IN ({', '.join('?' for _ in chunk)})", tuple(chunk))
        return found

    def active(self) -> list[Experiment]:
        """The experiments not done yet, those being proposed included."""
        return self._select(f"WHERE state IN ({', '.join('?' for _ in ACTIVE)})", ACTIVE)

    def active_code(self) -> list[tuple[int, str]]:
        """(id, code hash) of each experiment not done yet that has its asset, in id order: what
        is in flight, without reading the texts."""
        rows = self.db.execute(
            f"SELECT id, code_hash FROM experiments WHERE state IN ({', '.join('?' for _ in ACTIVE)}) "
            "AND asset IS NOT NULL AND code_hash IS NOT NULL ORDER BY id",
            ACTIVE,
        )
        return [(int(row[0]), str(row[1])) for row in rows]

    def started_without_branch(self) -> list[int]:
        """The experiments in flight, a run of them started, that have no branch pushed yet
        (bot.github.branches: a degraded mode left them so)."""
        rows = self.db.execute(
            f"SELECT e.id FROM experiments e WHERE e.state IN ({', '.join('?' for _ in ACTIVE)}) "
            "AND e.head_sha IS NULL AND EXISTS (SELECT 1 FROM runs r WHERE r.experiment_id = e.id "
            "AND r.state NOT IN ('queued', 'cancelled')) ORDER BY e.id",
            ACTIVE,
        )
        return [int(row[0]) for row in rows]

    def finished(self) -> list[Experiment]:
        return self._select("WHERE state = 'done'")

    def in_state(self, state: str) -> list[Experiment]:
        return self._select("WHERE state = ?", (state,))

    def requested(self) -> list[Experiment]:
        """Experiments with a person's request waiting."""
        return self._select("WHERE request IS NOT NULL")

    def count(self) -> int:
        """Every experiment, those the agent is still proposing included."""
        return self.db.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]

    def counts_by_status(self) -> dict[str, int]:
        """How many finished experiments have each status."""
        rows = self.db.execute("SELECT status, COUNT(*) FROM experiments WHERE state = 'done' GROUP BY status")
        return {r[0]: r[1] for r in rows}

    def by_code(self, code_hash: str) -> Experiment | None:
        """The first experiment that proposed this train.py."""
        row = self.db.execute(
            "SELECT * FROM experiments WHERE code_hash = ? ORDER BY id LIMIT 1", (code_hash,)
        ).fetchone()
        return experiment_of(row) if row else None

    def run_code_hashes(self, *, after: int = 0) -> list[tuple[int, str]]:
        """(run id, code_hash) of every run with an id above `after`, in id order: the train.py each
        measured (a rebased experiment's runs carry new ones, main's runs main's). A run's code never
        changes and no run is deleted, so a reader that keeps them reads only the new ones."""
        rows = self.db.execute("SELECT id, code_hash FROM runs WHERE id > ? ORDER BY id", (after,))
        return [(r[0], r[1]) for r in rows]

    def _select(self, where: str, params: tuple = ()) -> list[Experiment]:
        return [experiment_of(r) for r in self.db.execute(f"SELECT * FROM experiments {where} ORDER BY id", params)]
