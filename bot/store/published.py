"""The published table: what GitHub shows of each experiment, recorded apart from its lifecycle, so
publishing never changes a decision (bot.github.publisher writes it, one key and value per thing shown).

This module reads five of its keys: `pr` (the pull request's number), `check:<head sha>:<round>` (a
check run's id; `...:done` once it was completed), `final` (the status last shown of a finished
experiment, or summarised: bot.github.summaries), `round` (the round shown: the experiment's
`reopened` then) and `summary` (where it was summarised instead of shown on a pull request).
"""

from __future__ import annotations

from bot.store.db import Database
from bot.store.experiments import Experiment, experiment_of


class Published:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, exp_id: int) -> dict[str, str]:
        """Every key shown of one experiment, with its value."""
        rows = self.db.execute("SELECT key, value FROM published WHERE experiment_id = ?", (exp_id,))
        return {key: value for key, value in rows}

    def set(self, exp_id: int, key: str, value: str) -> None:
        self.db.execute(
            "INSERT INTO published(experiment_id, key, value) VALUES (?, ?, ?) "
            "ON CONFLICT(experiment_id, key) DO UPDATE SET value = excluded.value",
            (exp_id, key, value),
        )

    def with_key(self, key: str) -> dict[int, str]:
        """The experiments that have `key`, with its value (the summaries' marks, bot.github.summaries)."""
        rows = self.db.execute("SELECT experiment_id, value FROM published WHERE key = ?", (key,))
        return {int(exp_id): value for exp_id, value in rows}

    def behind(self) -> list[Experiment]:
        """Experiments GitHub may not show as they are: the active ones with a branch pushed, the
        finished ones whose final state (`final` = their status) is not published yet (pushed or,
        if any run of theirs was queued, not: one never pushed is listed in the research log), and
        those measured again since the round shown (`round` below their `reopened`), however that
        round ended. (A branchless one without runs failed or was cancelled before it ran, as every
        branchless one did before branches waited for their runs: nothing to show.)"""
        rows = self.db.execute(
            "SELECT e.* FROM experiments e "
            "LEFT JOIN published p ON p.experiment_id = e.id AND p.key = 'final' "
            "LEFT JOIN published r ON r.experiment_id = e.id AND r.key = 'round' "
            "WHERE e.branch IS NOT NULL AND (e.head_sha IS NOT NULL OR (e.state = 'done' "
            "AND EXISTS (SELECT 1 FROM runs x WHERE x.experiment_id = e.id))) "
            "AND (e.state != 'done' OR p.value IS NULL OR p.value != e.status "
            "OR CAST(COALESCE(r.value, '0') AS INTEGER) < e.reopened) ORDER BY e.id"
        )
        return [experiment_of(r) for r in rows]

    def experiment_of_pull(self, number: int) -> Experiment | None:
        """The experiment whose pull request has this number."""
        row = self.db.execute(
            "SELECT e.* FROM experiments e JOIN published p ON p.experiment_id = e.id "
            "WHERE p.key = 'pr' AND p.value = ?",
            (str(number),),
        ).fetchone()
        return experiment_of(row) if row else None

    def experiment_of_check_run(self, check_run_id: int) -> Experiment | None:
        """The experiment whose check run (one the publisher created: `check:<head>:<round>`) has this id."""
        row = self.db.execute(
            "SELECT e.* FROM experiments e JOIN published p ON p.experiment_id = e.id "
            "WHERE p.key LIKE 'check:%' AND p.key NOT LIKE '%:done' AND p.value = ?",
            (str(check_run_id),),
        ).fetchone()
        return experiment_of(row) if row else None
