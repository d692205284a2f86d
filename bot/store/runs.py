"""The runs table: each run queued, started, finished or set aside, and what it measured.

A run's id is its idempotency key with the runner. Its seed is chosen so that no code runs twice
under one seed (`next_seed`): a run of main's own train.py takes the smallest seed that train.py has
not run under, its runs as a kept experiment's included (those were selected for coming out low, and
a deterministic evaluator would repeat them exactly), so a new main is measured afresh; an
experiment's run measured on a main takes one of that main's seeds its own train.py has not run
under, so a candidate and main share seeds and the judge can compare them seed by seed
(bot.loop.pairing): the one whose pairs would overlap least with other experiments' on that main
(`_overlap`), main's earliest among equals, so that the experiments on one main spread over its runs
instead of all subtracting its first ones, and the paired noise they pool to knows more the more of
them there are (bot.loop.pairing.PairedPool). Beyond main's seeds it takes the smallest seed
neither its train.py nor main's has run under, and main gets a run under it where the paired rule
asks (the lifecycle passes that seed). A screening's short run (bot.core.records.full_budget) is
another measurement: an experiment's full run pairs with main's full runs only and its short run
with main's short runs only, so a short run never takes the seed a full run of main waits to pair
under. No code runs twice under one seed, whatever the budget: main's short runs take seeds its
full runs have not, so a candidate's short and full runs never share a seed either, and a short
run that came out low for its seed's sake does not pass that luck on to the full runs it earned. A run is queued in the same transaction as the experiment change that asks for
it; finishing is done once (a second report of the same run changes nothing); a run set aside (lost,
refused, disturbed, cancelled) is re-run as a new run with the same seed, in the same transaction. A
store written before seeds were chosen this way keeps its runs' seeds; a run queued since avoids them
as it avoids any other.

A run's value is stored on the judge's loss scale (`val_bpb`, whatever the task); the event that
says a run finished shows it in the task's metric, which the caller gives (training's by default).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from bot.core.records import full_budget
from bot.core.states import RunState, State
from bot.store.db import Database
from bot.store.events import Events
from bot.store.experiments import Experiments
from runner.tasks import TRAINING, Metric

# The base of a run queued ahead of the merge that makes a kept train.py main (its runs as the next
# main, bot.loop.baseline; a change re-grafted onto it, bot.loop.lifecycle): AHEAD and that train.py's
# code hash, `ahead_of(code_hash)`. Main's commit is named once main took it (`adopt`).
AHEAD = "ahead-of-merge:"


def ahead_of(code_hash: str) -> str:
    """The base of a run queued ahead of the merge that makes the train.py whose hash is `code_hash` main."""
    return AHEAD + code_hash


def is_ahead(base_sha: str) -> bool:
    """Whether a run's base names no commit yet: queued ahead of a keep's merge."""
    return base_sha.startswith(AHEAD)


@dataclass
class Run:
    id: int
    experiment_id: int | None
    purpose: str
    code_hash: str
    commit_sha: str
    base_sha: str
    asset: str
    profile: str
    seed: int
    state: str
    status: str | None
    val_bpb: float | None
    metrics: dict[str, Any]
    harness_hash: str | None
    data_fingerprint: str | None
    error: str | None
    log_tail: str | None
    run_dir: str | None
    queued_at: float
    started_at: float | None
    finished_at: float | None
    rerun_of: int | None
    note: str | None


def run_of(row: sqlite3.Row) -> Run:
    data = dict(row)
    data["metrics"] = json.loads(data["metrics"])
    return Run(**data)


class Runs:
    def __init__(self, db: Database, events: Events, experiments: Experiments) -> None:
        self.db = db
        self.events = events
        self.experiments = experiments

    # --- the lifecycle -------------------------------------------------------------------------
    def add(
        self,
        *,
        experiment_id: int | None,
        purpose: str,
        code_hash: str,
        commit_sha: str,
        base_sha: str,
        asset: str,
        profile: str,
        main_code: str | None = None,
        seed: int | None = None,
        experiment_fields: dict[str, Any] | None = None,
        reason: str | None = None,
    ) -> Run:
        """Queue a run; `experiment_fields` (a state change, say) are written in the same
        transaction, so a restart never finds the one without the other. An experiment's run is
        measured on the main whose train.py's hash is `main_code` (its seed pairs with main's:
        `next_seed`); `seed` gives a run of main the seed an experiment's next run will take."""
        now = time.time()
        with self.db.transaction() as conn:
            if seed is None:
                main = None if experiment_id is None else main_code
                seed = _next_seed(conn, code_hash, main, full=full_budget(purpose))
            cursor = conn.execute(
                "INSERT INTO runs(experiment_id, purpose, code_hash, commit_sha, base_sha, asset, profile,"
                " seed, state, queued_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?)",
                (experiment_id, purpose, code_hash, commit_sha, base_sha, asset, profile, seed, now),
            )
            run_id = cursor.lastrowid
            if experiment_fields:
                self.experiments.update(experiment_id, **experiment_fields)
            message = f"run {run_id} ({purpose}) queued" + (f": {reason}" if reason else "")
            self.events.add(experiment_id, "queued", message)
        self.db.failpoint(f"queued_{purpose}")
        return self.get(run_id)

    def next_seed(self, code_hash: str, main_code: str | None = None, *, full: bool = True) -> int:
        """The seed the next full run (a short one with `full` False) of the train.py whose hash is
        `code_hash` would get: main's own run when `main_code` is None, else an experiment's run
        measured on the main whose train.py's hash is `main_code` (main's least-taken seed of that
        budget it has not run under, or a new one)."""
        return _next_seed(self.db.conn, code_hash, main_code, full=full)

    def main_seeds(self, main_code: str, *, full: bool = True) -> list[int]:
        """The seeds of main's own full runs (short ones with `full` False) of the train.py whose hash
        is `main_code`, in the order they were queued (a re-run repeats its run's seed and is not
        counted again)."""
        return _main_seeds(self.db.conn, main_code, full=full)

    def set_commit(self, run_id: int, commit_sha: str) -> None:
        """The commit a queued run is to be measured at, known only once its branch was pushed."""
        self.db.execute("UPDATE runs SET commit_sha = ? WHERE id = ? AND state = 'queued'", (commit_sha, run_id))

    def adopt(self, run_ids: list[int], main_sha: str) -> None:
        """Runs queued ahead of a keep's merge now name the commit main took: their base, and for
        main's own runs their commit too (the kept branch's head, or none, had the same train.py;
        a forge that squashes makes another commit). An experiment's commit is its branch's."""
        with self.db.transaction() as conn:
            for run_id in run_ids:
                conn.execute(
                    "UPDATE runs SET base_sha = ?, commit_sha = CASE WHEN experiment_id IS NULL THEN ? ELSE commit_sha"
                    " END WHERE id = ?",
                    (main_sha, main_sha, run_id),
                )

    def mark_started(self, run_id: int, run_dir: str) -> None:
        self.db.execute(
            "UPDATE runs SET state = 'running', run_dir = ?, started_at = ? WHERE id = ?",
            (run_dir, time.time(), run_id),
        )
        self.db.failpoint("run_started")

    def finish(
        self,
        run_id: int,
        *,
        status: str,
        val_bpb: float | None,
        metrics: dict[str, Any],
        error: str | None,
        log_tail: str | None,
        metric: Metric = TRAINING.metric,
    ) -> Run:
        """Record a run's result, once: a run already done keeps its first result. `val_bpb` is on the
        loss scale; the run's event shows it in `metric`."""
        with self.db.transaction() as conn:
            cursor = conn.execute(
                "UPDATE runs SET state = 'done', status = ?, val_bpb = ?, metrics = ?, harness_hash = ?,"
                " data_fingerprint = ?, error = ?, log_tail = ?, finished_at = ? WHERE id = ? AND state != 'done'",
                (
                    status,
                    val_bpb,
                    json.dumps(metrics),
                    metrics.get("harness_hash"),
                    metrics.get("data_fingerprint"),
                    error,
                    log_tail,
                    time.time(),
                    run_id,
                ),
            )
            if cursor.rowcount:
                row = conn.execute("SELECT experiment_id, purpose FROM runs WHERE id = ?", (run_id,)).fetchone()
                steps = metrics.get("num_steps")
                if status != "ok":
                    said = (error or "").strip().splitlines() or ["no error"]  # a rejection's reason leads
                    what = f"rejected: {said[0][:200]}" if status == "rejected" else f"crashed: {said[-1][:200]}"
                else:
                    shown = f"{metric.name} {metric.value(val_bpb):.6f}" if val_bpb is not None else None
                    what = (shown or f"no {metric.name}") + (f" in {steps} steps" if steps else "")
                self.events.add(row["experiment_id"], "run", f"run {run_id} ({row['purpose']}) {what}")
        self.db.failpoint("run_done")
        return self.get(run_id)

    def set_aside(
        self, run_id: int, state: RunState, why: str, *, rerun: bool = True, result: dict[str, Any] | None = None
    ) -> Run | None:
        """Mark a run lost, refused, disturbed or cancelled (keeping what it reported in `result`)
        and, with `rerun`, queue an identical one (new id, the same seed), in one transaction."""
        now = time.time()
        result = result or {}
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE runs SET state = ?, note = ?, finished_at = ?, status = COALESCE(?, status),"
                " val_bpb = COALESCE(?, val_bpb), metrics = COALESCE(?, metrics), log_tail = COALESCE(?,"
                " log_tail) WHERE id = ?",
                (
                    state.value,
                    why,
                    now,
                    result.get("status"),
                    result.get("val_bpb"),
                    json.dumps(result["metrics"]) if "metrics" in result else None,
                    result.get("log_tail"),
                    run_id,
                ),
            )
            row = conn.execute("SELECT experiment_id FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise KeyError(f"no run {run_id}")
            new_id = None
            if rerun:
                cursor = conn.execute(
                    "INSERT INTO runs(experiment_id, purpose, code_hash, commit_sha, base_sha, asset, profile,"
                    " seed, state, queued_at, rerun_of) SELECT experiment_id, purpose, code_hash, commit_sha,"
                    " base_sha, asset, profile, seed, 'queued', ?, id FROM runs WHERE id = ?",
                    (now, run_id),
                )
                new_id = cursor.lastrowid
            again = f"; queued again as run {new_id}" if new_id else ""
            self.events.add(row[0], state.value, f"run {run_id}: {why}{again}")
        return self.get(new_id) if new_id else None

    # --- reads ---------------------------------------------------------------------------------
    def get(self, run_id: int) -> Run:
        row = self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no run {run_id}")
        return run_of(row)

    def all(
        self, *, state: str | None = None, experiment_id: int | None = None, code_hash: str | None = None
    ) -> list[Run]:
        """Every run, or those matching each filter given, in id order."""
        clauses, params = [], []
        for column, value in (("state", state), ("experiment_id", experiment_id), ("code_hash", code_hash)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return [run_of(r) for r in self.db.execute(f"SELECT * FROM runs{where} ORDER BY id", params)]

    def of_experiments(self, experiment_ids: list[int]) -> dict[int, list[Run]]:
        """The runs of each of these experiments, in id order: one read for all of them (the
        conductor judges every experiment in flight at each tick)."""
        found: dict[int, list[Run]] = {exp_id: [] for exp_id in experiment_ids}
        if experiment_ids:
            marks = ", ".join("?" for _ in experiment_ids)
            for row in self.db.execute(
                f"SELECT * FROM runs WHERE experiment_id IN ({marks}) ORDER BY id", experiment_ids
            ):
                found[row["experiment_id"]].append(run_of(row))
        return found

    def waiting_experiments(self, experiment_ids: list[int]) -> set[int]:
        """Those of these experiments with a run of their current train.py queued or running (their
        verdicts wait): one light read, so the runs of the others alone are read whole."""
        if not experiment_ids:
            return set()
        marks = ", ".join("?" for _ in experiment_ids)
        rows = self.db.execute(
            "SELECT DISTINCT runs.experiment_id FROM runs JOIN experiments ON experiments.id = runs.experiment_id"
            " AND experiments.code_hash = runs.code_hash WHERE runs.state IN ('queued', 'running')"
            f" AND runs.experiment_id IN ({marks})",
            experiment_ids,
        )
        return {row[0] for row in rows}

    def count(self, *states: str) -> int:
        """How many runs are in any of these states."""
        marks = ", ".join("?" for _ in states)
        return self.db.execute(f"SELECT COUNT(*) FROM runs WHERE state IN ({marks})", states).fetchone()[0]

    def recent_length_s(self, limit: int = 32) -> float | None:
        """The median seconds from start to finish of the latest `limit` finished runs, or None
        before one has finished."""
        rows = self.db.execute(
            "SELECT finished_at - started_at FROM runs WHERE state = 'done' AND started_at IS NOT NULL"
            " AND finished_at >= started_at ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        lengths = sorted(row[0] for row in rows)
        return lengths[len(lengths) // 2] if lengths else None

    def recent_ready_s(self, limit: int = 32) -> float | None:
        """How long the latest `limit` experiments took to be ready, the upper quartile (a slow one
        is met more often than the median says): from the moment each was opened for a proposal
        (its question) to its first run queued; one still being proposed or branched counts the
        time it has taken so far, so a slower agent shows at once. None before there is one."""
        rows = self.db.execute(
            "SELECT * FROM (SELECT COALESCE((SELECT MIN(queued_at) FROM runs WHERE experiment_id = experiments.id),"
            " CASE WHEN state IN (?, ?, ?) THEN ? END) - created_at AS ready FROM experiments ORDER BY id DESC)"
            " WHERE ready IS NOT NULL LIMIT ?",
            (State.PROPOSING, State.PROPOSED, State.BRANCHED, time.time(), limit),
        ).fetchall()
        ready = sorted(max(0.0, row[0]) for row in rows)
        return ready[(3 * len(ready)) // 4] if ready else None

    def ending_within(self, horizon_s: float, run_s: float) -> int:
        """How many running runs, each lasting `run_s`, are due to end within `horizon_s` from now."""
        return self.db.execute(
            "SELECT COUNT(*) FROM runs WHERE state = 'running' AND started_at IS NOT NULL AND started_at + ? <= ?",
            (run_s, time.time() + horizon_s),
        ).fetchone()[0]

    def next_ending_within(self, horizon_s: float, run_s: float) -> float | None:
        """Seconds from now until the next running run, each lasting `run_s`, comes within `horizon_s`
        of its end; None when every running run is there already (or none runs)."""
        now = time.time()
        row = self.db.execute(
            "SELECT MIN(started_at) FROM runs WHERE state = 'running' AND started_at IS NOT NULL AND started_at + ? > ?",
            (run_s - horizon_s, now),
        ).fetchone()
        return None if row[0] is None else row[0] + run_s - horizon_s - now

    def latest_ok(self, purpose: str, limit: int) -> list[Run]:
        """The latest `limit` finished runs of this purpose that reported ok, newest first."""
        rows = self.db.execute(
            "SELECT * FROM runs WHERE state = 'done' AND status = 'ok' AND purpose = ? ORDER BY id DESC LIMIT ?",
            (purpose, limit),
        )
        return [run_of(r) for r in rows]

    def measured_values(
        self, *, profile: str, harness_hash: str, data_fingerprint: str, threads: int | None = None
    ) -> list[tuple[str, int | None, str, float]]:
        """(code_hash, experiment_id, purpose, val_bpb) of every ok run under one identity (and, for
        CPU-clock runs, one thread count when `threads` is given), in run order: the first four of
        `measured_runs`."""
        runs = self.measured_runs(
            profile=profile, harness_hash=harness_hash, data_fingerprint=data_fingerprint, threads=threads
        )
        return [run[:4] for run in runs]

    def measured_runs(
        self, *, profile: str, harness_hash: str, data_fingerprint: str, threads: int | None = None
    ) -> list[tuple[str, int | None, str, float, int, str, str | None]]:
        """(code_hash, experiment_id, purpose, val_bpb, seed, base_sha, params_fingerprint) of every ok
        run under one identity (and, for CPU-clock runs, one thread count when `threads` is given), in
        run order. The fingerprint of its model's parameters' names, shapes and dtypes is the
        scorer's (runner.score), None for a run whose runner reported none: seed, main and
        fingerprint pair a candidate's run with main's (bot.loop.pairing.paired_differences).

        The runs bot.loop.measurement.counted picks of every run: this query must match its rule
        (tests/bot/loop/test_measurement.py pins the two equal). The conductor asks again after each
        run it records, and reading whole runs (their logs among them) to apply the rule costs ten times this."""
        rows = self.db.execute(
            "SELECT code_hash, experiment_id, purpose, val_bpb, seed, base_sha,"
            " json_extract(metrics, '$.params_fingerprint') FROM runs WHERE state = 'done' AND status = 'ok'"
            " AND val_bpb IS NOT NULL AND profile = ? AND harness_hash = ? AND data_fingerprint = ?"
            " AND (? IS NULL OR json_extract(metrics, '$.clock') IS NOT 'cpu'"
            " OR json_extract(metrics, '$.threads') = ?) ORDER BY id",
            (profile, harness_hash, data_fingerprint, threads, threads),
        )
        return [(r[0], r[1], r[2], r[3], r[4], r[5], r[6] if isinstance(r[6], str) else None) for r in rows]


def _main_seeds(conn: sqlite3.Connection, main_code: str, *, full: bool) -> list[int]:
    rows = conn.execute(
        "SELECT seed, purpose FROM runs WHERE experiment_id IS NULL AND code_hash = ? AND rerun_of IS NULL ORDER BY id",
        (main_code,),
    )
    return [seed for seed, purpose in rows if full_budget(purpose) == full]


def _next_seed(conn: sqlite3.Connection, code_hash: str, main_code: str | None, *, full: bool) -> int:
    """For an experiment's run on main: of main's seeds of the same budget (`full`: its full runs',
    else its short runs') this code has not run under, the one whose pairs would overlap least with
    other experiments' of that budget on that main (`_overlap`; main's earliest among equals), else
    the smallest seed neither this code nor main's has run under; for main's own run, the smallest
    seed its code has not run under. A seed taken at either budget is taken."""
    codes = [code_hash] if main_code is None else [code_hash, main_code]
    marks = ", ".join("?" for _ in codes)
    rows = conn.execute(f"SELECT DISTINCT code_hash, seed FROM runs WHERE code_hash IN ({marks})", codes)
    used: dict[str, set[int]] = {code: set() for code in codes}
    for code, seed in rows:
        used[code].add(seed)
    if main_code is not None:
        free = [seed for seed in _main_seeds(conn, main_code, full=full) if seed not in used[code_hash]]
        if free:
            overlap = _overlap(conn, main_code, code_hash, full=full)
            return min(free, key=lambda seed: overlap.get(seed, 0))  # min keeps the first of equals
    taken = set().union(*used.values())
    return next(seed for seed in range(1, len(taken) + 2) if seed not in taken)


def _overlap(conn: sqlite3.Connection, main_code: str, code_hash: str, *, full: bool) -> dict[int, int]:
    """Seed -> what a run of `code_hash` under it would add to the overlap of its pairs with other
    experiments' on main (the train.py whose hash is `main_code`): over the other experiments' runs of
    one code on a commit where main's has runs (a re-run not counted again) that took the seed, 1 + 2 x
    the seeds they share with `code_hash`'s runs there, runs of the budget `full` says alone. That is
    the growth of the sum over them of k^2, k the runs of main two experiments' pairs share, which is
    what the paired pool's degrees of freedom lose (bot.loop.pairing.PairedPool): the experiments on
    one main spread over its runs instead of all subtracting its first ones."""
    rows = conn.execute(
        "SELECT experiment_id, code_hash, seed, purpose FROM runs WHERE experiment_id IS NOT NULL"
        " AND rerun_of IS NULL AND base_sha IN (SELECT base_sha FROM runs WHERE experiment_id IS NULL"
        " AND code_hash = ?)",
        (main_code,),
    )
    own: set[int] = set()
    others: dict[tuple[int, str], set[int]] = {}
    for experiment, code, seed, purpose in rows:
        if full_budget(purpose) != full:
            continue
        if code == code_hash:
            own.add(seed)
        else:
            others.setdefault((experiment, code), set()).add(seed)
    overlap: dict[int, int] = {}
    for seeds in others.values():
        shared = len(seeds & own)
        for seed in seeds:
            overlap[seed] = overlap.get(seed, 0) + 1 + 2 * shared
    return overlap
