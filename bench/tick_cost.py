"""Benchmark: what an idle tick of the conductor costs as the history grows.

Builds a work directory whose store holds N finished experiments (each with its runs and
events) and one experiment whose run is in flight, then calls the real Conductor.tick() over and
over while nothing changes (the state between results: a run in flight, no free slot, nothing to
propose). Reports per tick: wall and CPU time (median and p95), and the number of SQL statements
and forge (git) calls (the last two are exact counts, the same on any machine: they show whether the tick
reads by what changed or reads the whole history).

    .venv/bin/python bench/tick_cost.py [--sizes 10 100 1000] [--ticks 300]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # the project first: tests/bot/... (directories, no packages) must not shadow bot/...
sys.path.append(str(ROOT / "tests"))  # the fake runner of the tests: a run that never ends

from fakes import IDENTITY, FakeRunner, result_for, with_effect  # noqa: E402

from bot.agent.scripted import ScriptedAgent  # noqa: E402
from bot.core.records import Job, Proposal, code_hash  # noqa: E402
from bot.core.states import RunState, State, Status  # noqa: E402
from bot.forge.local import LocalForge, init_research_repo  # noqa: E402
from bot.loop.conductor import Conductor, ConductorConfig  # noqa: E402
from bot.store import Store  # noqa: E402

MAIN = with_effect((ROOT / "train.py").read_text(), 0.0, "main")
PROGRAM = "---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n---\n\nLower val_bpb.\n"


class CountingForge:
    """The real forge, counting the calls made to it."""

    def __init__(self, forge: LocalForge) -> None:
        self.forge = forge
        self.calls = 0

    def __getattr__(self, name: str):
        attribute = getattr(self.forge, name)
        if not callable(attribute):
            return attribute

        def counted(*args, **kwargs):
            self.calls += 1
            return attribute(*args, **kwargs)

        return counted


def populate(store: Store, main_sha: str, n: int) -> None:
    """N finished experiments (a candidate run each, every third confirmed), main measured twice."""

    def run(exp_id: int | None, purpose: str, asset: str) -> None:
        queued = store.runs.add(
            experiment_id=exp_id,
            purpose=purpose,
            code_hash=code_hash(asset),
            commit_sha=main_sha,
            base_sha=main_sha,
            asset=asset,
            profile="smoke",
        )
        store.runs.mark_started(queued.id, f"fake://{queued.id}")
        result = result_for(Job(run_id=queued.id, asset=asset, profile="smoke", seed=queued.id))
        store.runs.finish(
            queued.id,
            status=result.status,
            val_bpb=result.val_bpb,
            metrics=result.metrics,
            error=None,
            log_tail=result.log_tail,
        )

    for _ in range(2):
        run(None, "baseline", MAIN)
    for i in range(n):
        asset = with_effect(MAIN, 0.01 + i * 1e-6, f"experiment {i}")
        exp = store.experiments.start_proposing(main_sha)
        store.experiments.fill_proposal(
            exp.id,
            title=f"experiment {i}",
            hypothesis="a change",
            slug=f"e{i}",
            code_hash=code_hash(asset),
            asset=asset,
            meta={},
        )
        store.experiments.update(exp.id, state=State.BRANCHED, head_sha=main_sha)
        store.experiments.update(exp.id, state=State.MEASURING)
        run(exp.id, "candidate", asset)
        if i % 3 == 0:
            run(exp.id, "confirm", asset)
        store.experiments.update(
            exp.id, state=State.CLOSING, status=Status.DISCARD, val_bpb=2.01, delta=0.01, reason="worse"
        )
        store.experiments.update(exp.id, state=State.DONE, event="discard: worse")


def time_ticks(loop: Conductor, store: Store, ticks: int) -> tuple[list[float], list[float], int]:
    """Wall and CPU seconds of each of `ticks` ticks, and the SQL statements they ran in all."""
    statements = 0

    def count(_: str) -> None:
        nonlocal statements
        statements += 1

    store.db.set_trace_callback(count)
    walls, cpus = [], []
    for _ in range(ticks):
        wall, cpu = time.perf_counter(), time.process_time()
        loop.tick()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    store.db.set_trace_callback(None)
    return walls, cpus, statements


def measure(n: int, ticks: int) -> dict[str, float | int]:
    work = Path(tempfile.mkdtemp(prefix=f"tick-{n}-"))
    forge = init_research_repo(work / "repo", {"train.py": MAIN, "program.md": PROGRAM})
    store = Store(work / "state.db")
    populate(store, forge.main_sha(), n)
    runner = FakeRunner(auto=False)  # the run in flight never ends during the measurement
    agent = ScriptedAgent([])
    loop = Conductor(
        store,
        LocalForge(work / "repo"),
        runner,
        agent,
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=n + 1, lookahead=0),
    )
    # one more experiment, proposed and in flight: the idle state between two results
    asset = with_effect(MAIN, -0.01, "in flight")
    agent.proposals.append(Proposal("in flight", "a change in flight", asset))
    for _ in range(200):
        loop.tick()
        if runner.running():
            break
        time.sleep(0.005)
    assert runner.running() and store.experiments.count() == n + 1, "no run in flight"
    for _ in range(5):
        loop.tick()  # warm caches (main, its values) as a long-running conductor has them

    forge_calls = CountingForge(loop.forge)
    loop.forge = forge_calls  # type: ignore[assignment]
    walls, cpus, statements = time_ticks(loop, store, ticks)
    assert store.runs.count(RunState.RUNNING) == 1
    store.close()
    return {
        "experiments": n,
        "wall_ms_median": 1000 * statistics.median(walls),
        "wall_ms_p95": 1000 * sorted(walls)[int(0.95 * len(walls))],
        "cpu_ms_median": 1000 * statistics.median(cpus),
        "sql_statements_per_tick": statements / ticks,
        "forge_calls_per_tick": forge_calls.calls / ticks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--ticks", type=int, default=300)
    args = parser.parse_args()
    print(
        f"# {' '.join(sys.argv)}  |  {time.strftime('%Y-%m-%d')}  |  {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}"
    )
    rows = [measure(n, args.ticks) for n in args.sizes]
    print(
        "| experiments in the store | idle tick wall ms (median) | p95 | CPU ms (median) | SQL statements per tick "
        "| forge calls per tick |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['experiments']} | {row['wall_ms_median']:.2f} | {row['wall_ms_p95']:.2f} | "
            f"{row['cpu_ms_median']:.2f} | {row['sql_statements_per_tick']:.0f} | {row['forge_calls_per_tick']:.0f} |"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
