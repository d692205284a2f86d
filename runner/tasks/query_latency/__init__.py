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

from importlib import import_module
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
STARTER = HERE / "query.sql"
PROGRAM = HERE / "program.md"
REFERENCE = HERE / "reference.sql"
PROFILES = ("smoke", "cpu")  # what `profile` may be (database.SCALES)
# The contract's functions, imported on first use: the bot's proposal check imports asset.py from
# here, and the service it runs in may have neither numpy nor pyarrow (the slim image).
_FUNCTIONS = {"prepare": "database", "fingerprint": "database", "evaluate": "evaluator"}

__all__ = ["PROFILES", "PROGRAM", "REFERENCE", "STARTER", "evaluate", "fingerprint", "prepare"]


def __getattr__(name: str) -> Any:
    if name in _FUNCTIONS:
        return getattr(import_module(f"{__name__}.{_FUNCTIONS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
