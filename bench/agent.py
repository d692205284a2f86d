"""Benchmark: the Claude agent's prompt size and price, its own latency, and runner idle time.

1. Prompt tokens per proposal for the real train.py and program.md with a 50-experiment history:
   two proposals on the same main (two turns each: an edit, then submit) against the scripted
   Messages API of the tests, which counts a token as 4 characters (the real tokenizer differs by
   some tens of percent; the split between cached and uncached is what this shows), priced at the
   default model's list prices.
2. The agent's own latency per proposal (building the prompt, the tools, parsing, the edit, the
   checks), measured with a model that answers at once over loopback: an upper bound.
3. Runner idle time with a model that answers in 20 s against a 300 s run, scaled down 100 times
   (0.1 s per model turn, two turns: 0.2 s a proposal, against 3 s runs), one slot, with and
   without lookahead: the real conductor and driver, a runner whose jobs end after their time.

    .venv/bin/python bench/agent.py [--experiments 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # the project first: tests/bot/... (directories, no packages) must not shadow bot/...
sys.path.append(str(ROOT / "tests"))

import anthropic  # noqa: E402
from anthropic_standin import AnthropicStandIn, edit_then_submit  # noqa: E402
from fakes import IDENTITY, result_for  # noqa: E402

from bot.agent import pricing  # noqa: E402
from bot.agent.claude import ClaudeAgent, ClaudeConfig  # noqa: E402
from bot.core.records import HistoryEntry, Job, ProposalContext, RunStatus, code_hash  # noqa: E402
from bot.forge.local import init_research_repo  # noqa: E402
from bot.loop.conductor import Conductor, ConductorConfig  # noqa: E402
from bot.loop.driver import Driver  # noqa: E402
from bot.store import Store  # noqa: E402

warnings.filterwarnings("ignore", message="The model .* is deprecated")
MAIN = (ROOT / "train.py").read_text()
PROGRAM = (ROOT / "program.md").read_text()


def model(delay_s: float):
    """Turn 1: a unique edit; turn 2: submit."""
    return edit_then_submit(lambda n: f"_variant = {n}", delay_s=delay_s)


def context(n_history: int) -> ProposalContext:
    history = [
        HistoryEntry(
            id=i,
            title=f"experiment {i}: change knob {i % 7} by {i % 5 + 1}0%",
            hypothesis="",
            status=("keep", "discard", "discard", "crash")[i % 4],
            val_bpb=1.0 + i / 1000,
            delta=(-0.002, 0.001, 0.0004, None)[i % 4],
            code_hash=f"{i:064d}",
            margin=0.0015,
            lesson="within the noise margin 0.00150 (2 runs)",
        )
        for i in range(1, n_history + 1)
    ]
    return ProposalContext(
        program_md=PROGRAM,
        asset=MAIN,
        main_val_bpb=1.01,
        history=history,
        feedback=["alice on #12: try a longer warmdown", "bob asks to try next: a deeper model"],
        seen_hashes={code_hash(MAIN)},
        profile="h100",
        device_kind="cuda",
        main_sha="a" * 40,
    )


def prompt_figures(n_history: int) -> dict:
    config = ClaudeConfig()
    with AnthropicStandIn([model(0.0)] * 4) as api:
        client = anthropic.Anthropic(api_key=api.api_key, base_url=api.base_url, max_retries=0)
        agent = ClaudeAgent(config, client=client)
        proposals = [agent.propose(context(n_history)) for _ in range(2)]
        assert not api.violations, api.violations
    rows = []
    for p in proposals:
        usage = p.meta["usage"]
        rows.append({**usage, "cost_usd": round(pricing.cost_usd(usage, config.prices), 5), "turns": p.meta["turns"]})
    return {"model": config.model, "prices": vars(config.prices), "proposals": rows}


def latency_figures(n: int = 10) -> dict:
    with AnthropicStandIn([model(0.0)] * (2 * n)) as api:
        client = anthropic.Anthropic(api_key=api.api_key, base_url=api.base_url, max_retries=0)
        agent = ClaudeAgent(ClaudeConfig(), client=client)
        ctx = context(50)
        times = []
        for _ in range(n):
            start = time.perf_counter()
            agent.propose(ctx)
            times.append(time.perf_counter() - start)
    times.sort()
    return {
        "proposals": n,
        "median_ms": round(1000 * times[n // 2], 1),
        "max_ms": round(1000 * times[-1], 1),
        "note": "two model calls over loopback included",
    }


class TimedRunner:
    """One slot; a job ends `seconds` after it was submitted and wakes the driver."""

    def __init__(self, seconds: float) -> None:
        self.slots, self.seconds = 1, seconds
        self.jobs: dict[int, tuple[Job, float]] = {}
        self.busy: list[tuple[float, float]] = []  # (start, end) of every job
        self._notify = None

    def on_change(self, callback) -> None:
        self._notify = callback

    def submit(self, job: Job) -> str:
        if job.run_id not in self.jobs:
            start = time.monotonic()
            self.jobs[job.run_id] = (job, start)
            self.busy.append((start, start + self.seconds))
            threading.Timer(self.seconds, lambda: self._notify and self._notify()).start()
        return f"timed://{job.run_id}"

    def lookup(self, run_id: int) -> RunStatus:
        job, start = self.jobs[run_id]
        if time.monotonic() - start < self.seconds:
            return RunStatus("running", progress={})
        return RunStatus("finished", result=result_for(job))

    def cancel(self, run_id: int) -> None:
        pass


def idle_figures(experiments: int, run_s: float, turn_s: float, lookahead: int | None) -> dict:
    program = (
        f"---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n  max_experiments: {experiments}\n"
        "  confirm: false\n---\n\nLower val_bpb.\n"
    )
    with tempfile.TemporaryDirectory() as tmp, AnthropicStandIn([model(turn_s)] * (4 * experiments + 8)) as api:
        forge = init_research_repo(Path(tmp) / "repo", {"train.py": MAIN, "program.md": program})
        runner = TimedRunner(run_s)
        client = anthropic.Anthropic(api_key=api.api_key, base_url=api.base_url, max_retries=0, timeout=30)
        loop = Conductor(
            Store(Path(tmp) / "state.db"),
            forge,
            runner,
            ClaudeAgent(ClaudeConfig(), client=client),
            ConductorConfig(profile="smoke", identity=dict(IDENTITY), lookahead=lookahead),
        )
        Driver(loop, timer_s=5.0).run()
    spans = sorted(runner.busy)[2:]  # after main's two baseline runs: the experiments' runs
    first, last = spans[0][0], spans[-1][1]
    busy = sum(end - start for start, end in spans)
    return {
        "lookahead": "one per slot" if lookahead is None else lookahead,
        "runs": len(spans),
        "idle_share": round(1 - busy / (last - first), 4),
        "wall_s": round(last - first, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=8)
    parser.add_argument("--history", type=int, default=50)
    args = parser.parse_args()
    os.environ.pop("ANTHROPIC_API_KEY", None)
    report = {
        "prompt": prompt_figures(args.history),
        "agent_latency": latency_figures(),
        "idle": [idle_figures(args.experiments, 3.0, 0.1, None), idle_figures(args.experiments, 3.0, 0.1, 0)],
    }
    for i, p in enumerate(report["prompt"]["proposals"], 1):
        print(
            f"proposal {i}: input {p['input_tokens']}, cache write {p['cache_creation_input_tokens']}, cache read "
            f"{p['cache_read_input_tokens']}, output {p['output_tokens']} tokens over {p['turns']} turns: "
            f"${p['cost_usd']:.4f}"
        )
    print(f"agent latency (model answering at once): {report['agent_latency']}")
    for row in report["idle"]:
        print(
            f"runner idle with lookahead {row['lookahead']}: {row['idle_share']:.1%} of {row['wall_s']} s "
            f"({row['runs']} runs)"
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
