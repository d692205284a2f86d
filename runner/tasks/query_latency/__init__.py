"""The query-latency task: make a slow SQL query fast, judged by its p95 latency.

The asset is query.sql (asset.py: CREATE INDEX and ANALYZE statements, then one query with named
parameters); the metric is p95_ms, lower is better. The evaluator module contract of
runner.tasks, with its parts:
- database.py: `prepare(profile)` generates the shop's database (SQLite, millions of rows at the
  "cpu" profile, a small one at "smoke"), the workload's parameter sets and the reference's rows
  for each, once, in the cache; `fingerprint(profile)` finds them or raises DataMissing;
- evaluator.py: `evaluate(asset, profile, seed, workdir)` copies the database, runs the measuring
  process (measure.py) sandboxed within a time box, and turns its answer into an Evaluation;
- guard.py: the SQLite authorizer that keeps the asset's statements inside their copy;
- query.sql, the starting asset (correct and deliberately slow), reference.sql (whose rows define
  correctness) and program.md (the research program an agent is given).
"""

from __future__ import annotations

from pathlib import Path

from runner.tasks.query_latency.database import fingerprint, prepare
from runner.tasks.query_latency.evaluator import evaluate

HERE = Path(__file__).parent
STARTER = HERE / "query.sql"
PROGRAM = HERE / "program.md"
REFERENCE = HERE / "reference.sql"

__all__ = ["PROGRAM", "REFERENCE", "STARTER", "evaluate", "fingerprint", "prepare"]
