"""bench/duty_cycle.py at a tiny size: the real service on the GitHub stand-in, simulated runner
slots and agent. Only what is sure is asserted (every experiment ends and is published, nothing
broke the API description, the runner never got more jobs than slots), never a timing."""

from __future__ import annotations

import benches


def load_bench():
    return benches.load("duty_cycle")


def test_every_experiment_finishes_on_simulated_slots():
    bench = load_bench()
    row = bench.run(
        bench.Options(slots=2, experiments=3, scale=600.0, latency_ms=0.0, first_baseline_runs=2, timeout_s=180.0)
    )
    assert row["experiments"] == 3
    assert sum(row["statuses"].values()) == 3
    assert row["runs"]["baseline"] >= 2 and row["runs"]["candidate"] >= 3
    assert row["violations"] == 0
    assert row["overbooked"] == 0
    assert {"gap_p95", "cpu_per_exp", "exp_per_h", "utilisation"} <= set(row)


def test_as_the_actions_runner_every_run_is_one_workflow_dispatch_github_accepts():
    """--actions: every branch pushed when proposed, and each run a workflow dispatch of its commit
    that the stand-in checks against the workflow's inputs (an unexpected or missing one is refused)."""
    bench = load_bench()
    row = bench.run(
        bench.Options(
            slots=2, experiments=3, scale=600.0, latency_ms=0.0, first_baseline_runs=2, timeout_s=180.0, actions=True
        )
    )
    assert row["experiments"] == 3 and row["violations"] == 0
    assert row["workflow_dispatches"] == row["submitted"] >= 2 + 3
