"""Results out of the store: the reference's results.tsv, a table for people, JSON for tools.

results.tsv has the reference's columns, tab-separated:
    commit  val_bpb  memory_gb  status  description
with the baseline of the first main as its first row (status keep), then one row per finished
experiment (status keep, discard, crash or failed; a crash or failure shows val_bpb 0.000000 and
memory 0.0). The richer rows (delta, margin, re-measured delta, steps, tokens/s) and one row per
run are for `autoresearch results`.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bot.loop import measurement
from bot.store import Run, Store
from runner import files

TSV_COLUMNS = ["commit", "val_bpb", "memory_gb", "status", "description"]


def _first_main_runs(store: Store) -> list[Run]:
    """The finished baseline runs of the first main measured under the work directory's pinned
    identity (crashes included): after a harness or data change, the baseline starts afresh."""
    identity = store.identity()
    baseline = [r for r in store.runs(state="done") if r.purpose == "baseline"
                and (not identity or r.status != "ok" or measurement.counts(r, identity))]
    first = next((r.code_hash for r in baseline if r.status == "ok"), None)
    return [r for r in baseline if r.code_hash == first] if first else []


def baseline_val_bpb(store: Store) -> float | None:
    """Mean val_bpb of the first main's baseline runs."""
    values = [r.val_bpb for r in _first_main_runs(store) if r.status == "ok" and r.val_bpb is not None]
    return statistics.fmean(values) if values else None


def rows(store: Store) -> list[dict[str, Any]]:
    """One dict per row: the baseline, then every finished experiment, in order."""
    out: list[dict[str, Any]] = []
    first_main = _first_main_runs(store)
    if first_main:
        same = [r for r in first_main if r.status == "ok"]
        out.append({"id": 0, "commit": first_main[0].commit_sha[:7], "val_bpb": baseline_val_bpb(store),
                    "delta": None, "margin": None, "remeasured_delta": None, "memory_gb": _memory_gb(same),
                    "status": "keep", "runs": len(same), "steps": _mean_metric(same, "num_steps"),
                    "tokens_per_second": _mean_metric(same, "tokens_per_second"),
                    "description": "baseline", "reason": "main as it was before any experiment", "cost_usd": None})
    for exp in store.experiments(active=False):
        runs = [r for r in store.runs(experiment_id=exp.id) if r.state == "done"]
        crashed = exp.status in ("crash", "failed")
        ok = [r for r in runs if r.status == "ok"]
        out.append({"id": exp.id, "commit": (exp.head_sha or "")[:7],
                    "val_bpb": None if crashed else exp.val_bpb, "delta": None if crashed else exp.delta,
                    "margin": exp.margin, "remeasured_delta": exp.remeasured_delta,
                    "memory_gb": 0.0 if crashed else _memory_gb(runs), "status": exp.status,
                    "runs": len(runs), "steps": _mean_metric(ok, "num_steps"),
                    "tokens_per_second": _mean_metric(ok, "tokens_per_second"),
                    "description": exp.title, "reason": exp.reason, "cost_usd": exp.meta.get("cost_usd")})
    return out


def run_rows(store: Store) -> list[dict[str, Any]]:
    """One dict per run, set-aside runs included, with what the harness measured."""
    return [{"run": r.id, "experiment": r.experiment_id, "purpose": r.purpose, "state": r.state,
             "status": r.status, "val_bpb": r.val_bpb, "steps": r.metrics.get("num_steps"),
             "tokens_per_second": r.metrics.get("tokens_per_second"), "cpu_share": r.metrics.get("cpu_share"),
             "seconds": r.metrics.get("total_seconds"), "commit": r.commit_sha[:7], "note": r.note or r.error}
            for r in store.runs()]


def _mean_metric(runs: list[Run], key: str) -> float | None:
    values = [r.metrics[key] for r in runs if isinstance(r.metrics.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def to_tsv(store: Store) -> str:
    lines = ["\t".join(TSV_COLUMNS)]
    for row in rows(store):
        description = " ".join(row["description"].split())  # no tabs or line breaks inside a field
        lines.append("\t".join([row["commit"], f"{row['val_bpb'] or 0.0:.6f}", f"{row['memory_gb']:.1f}",
                                row["status"], description]))
    return "\n".join(lines) + "\n"


def export_tsv(store: Store, path: Path) -> None:
    files.write_text(path, to_tsv(store))


def _memory_gb(runs: list) -> float:
    peaks = [r.metrics.get("peak_vram_mb", 0.0) or 0.0 for r in runs if r.status == "ok"]
    return max(peaks, default=0.0) / 1024
