"""Query latency through the real conductor, judged on its log scale: a fake evaluator whose p95 is
the query's speed times a per-seed wobble of a share of it (a slow 2000 ms main spreads by about
500 ms, a fast 20 ms one by about 2 ms, as real timings do), so main's noise pooled over the slow main
and the fast one is a ratio. After a 100-fold win, a further 20% gain on the fast main is kept: in
milliseconds, the slow main's spread pooled in would have made the margin hundreds of milliseconds
around a 20 ms main, and nothing more could be kept."""

from __future__ import annotations

import math
import re
import zlib
from pathlib import Path

from fakes import IDENTITY, FakeRunner, result_for

from bot.agent.scripted import ScriptedAgent
from bot.core.records import Job, Proposal, RunResult
from bot.forge.local import init_research_repo
from bot.loop.conductor import Conductor
from bot.views.read_model import view_of
from runner.tasks import QUERY_LATENCY
from tests.bot.loop.test_lifecycle import make, program, run_to_end

SLOW_MS = 2000.0
SPEED = re.compile(r"^-- fake speed: (\S+)$", re.M)  # the fake evaluator's reading of a query.sql


def query(first: float = 1.0, second: float = 1.0) -> str:
    """A query.sql `first` times `second` as fast as main's first, each factor in a part of its own
    with an index named after it (code, so that a change is not a comment's), far enough apart that
    a change to one merges cleanly over a change to the other."""
    filler = "".join(f"CREATE INDEX IF NOT EXISTS filler_{k} ON orders(day);\n" for k in range(4))
    return (
        f"-- fake speed: {first!r}\nCREATE INDEX IF NOT EXISTS first_{first:g} ON orders(day);\n{filler}"
        f"-- fake speed: {second!r}\nCREATE INDEX IF NOT EXISTS second_{second:g} ON orders(customer_id);\n"
        "SELECT count(*) FROM orders;\n"
    )


def p95_ms(asset: str, seed: int) -> float:
    """The query's p95 under one seed: main's 2000 ms over its speed, wobbling by up to 12% of itself
    when slow and 5% when fast, the same for the same query and seed."""
    speed = SLOW_MS / math.prod(float(factor) for factor in SPEED.findall(asset))
    share = 0.12 if speed > 100 else 0.05
    wobble = (zlib.crc32(f"{asset}|{seed}".encode()) % 21 - 10) / 10  # -1 .. 1
    return speed * (1 + share * wobble)


def latency_loop(tmp_path: Path, proposals: list[Proposal]) -> Conductor:
    """A conductor on query latency, main's query.sql at 2000 ms, proposing `proposals` in turn."""
    identity = dict(IDENTITY, task=QUERY_LATENCY.name)
    settings = dict(task=QUERY_LATENCY.name, first_baseline_runs=4, baseline_runs=4)
    files = {"query.sql": query(), "program.md": program(**settings)}

    def outcome(job: Job) -> RunResult:
        return result_for(job, identity=identity, val_bpb=QUERY_LATENCY.metric.loss(p95_ms(job.asset, job.seed)))

    return make(
        tmp_path,
        ScriptedAgent(proposals),
        forge=init_research_repo(tmp_path / "repo", files),
        runner=FakeRunner(outcome=outcome),
        identity=identity,
        experiments=len(proposals),
    )


def test_after_a_hundredfold_win_a_further_20_percent_gain_is_kept(tmp_path: Path) -> None:
    hundredfold = Proposal("an index on orders(day)", "a scan no more", query(first=100.0))
    a_fifth_off = Proposal("a covering index", "no lookups either", query(second=1.25))  # made on the slow main
    loop = latency_loop(tmp_path, [hundredfold, a_fifth_off])
    run_to_end(loop)
    first, second = loop.store.experiments.all()
    assert (first.status, second.status) == ("keep", "keep"), second.reason
    assert "beats main" in second.reason and "%" in second.reason  # its gain and margin in percent
    view = view_of(loop.store)
    assert view.main.val_bpb is not None and 15 < view.main.val_bpb < 17.5  # milliseconds
    assert view.main.margin is not None and math.expm1(view.main.margin) < 0.25  # a share, not 1972 ms
