"""Benchmark: how busy the bot keeps K runner slots (the GPU duty cycle), and what it costs.

Runs the real service (bot.app.serve.Service: conductor, driver, GitHub forge, publisher, poller) on
the GitHub stand-in of the tests, started in a child process (so its CPU and its interpreter lock
are not the bot's, as GitHub's are not) with `--latency-ms` (100) added to every REST call. The
runner is simulated: K slots, each job sleeps a scaled budget on a timer and then answers through
the real protocol (a runner.protocol.ResultSpec checked by bot.runners.specs.checked_result,
with the job's asset sha256, this harness's hash, the identity's data fingerprint, its profile and
seed). The agent is simulated too: it sleeps a scaled think time and adds one distinct constant
to main's train.py (`_sim_change_<n> = <effect>`); a share of them are clear gains (kept, merged,
main measured afresh), the rest small losses or noise.

Time is scaled by `--scale` (100): a 3 s job stands for a 300 s run, a 0.2 s answer for a 20 s
one. Everything of the bot that follows the clock is scaled the same way (the driver's timer, the
publisher's progress cadence, the write pacer's windows: 80 writes per 0.6 s stands for 80 per
minute), except the stand-in's latency: `--latency-ms` is added as given (100 ms stands for
100 ms, so it is 100 times heavier here than in service; pass 1 to scale it too).

Reported per K:
- experiments per hour in steady state (completions between the K-th and the N-K-th, so the first
  baselines and the drain at the end are left out), scaled back to real time, against the ideal
  K * 3600 / 300;
- slot utilisation in steady state, over the same completions as experiments per hour ("util
  steady"), and from the first experiment run's start to the last run's start, ramp and drain
  included ("util"): busy
  slot-seconds / (K * window), split into experiment runs (candidates, confirmations, re-measures)
  and main's baseline runs (which legitimately use slots: after each keep main is measured again);
- the idle gap of a slot between two runs (end of one job to start of the next, from the runner's
  own timestamps), p50/p95/max, as a share of the scaled budget, and where it went: waiting for
  the tick in progress to end, the dispatching tick's work before dispatch, or no run ready; the
  same for the tail alone (the gaps from the 90th percentile up), with the purposes of the runs
  that ended them; and the same p95 and max before the drain ("p95 bd", "max bd": the gaps that
  began before the agent was asked its last question; after it, a slot that frees waits for what
  the judge still wants, where in service the agent would be asked again);
- the bot's CPU seconds per experiment: time.process_time() of this process (the stand-in is
  elsewhere) minus this main thread's own, and the conductor thread's time.thread_time();
- the proposal pipeline: the share of the window the agent was thinking, proposals per budget,
  and the mean wait between an answer and the next question (the conductor's ticks);
- the GitHub requests the stand-in served, the content-creating ones per experiment and per hour
  (scaled back to real time), the write budget's mode at the end, and the seconds it waited.

The soak (`--soak`, or any --kill-share / --slot-plan): the simulated runner loses a share of its
runs part way through (`--kill-share`: lookup says lost, as for a preempted container or an
Actions runner taken offline) and its slots change while the bot runs (`--slot-plan`: once a
share of the experiments is decided, so many slots); then it checks that every experiment was
decided once, every lost run was run again (and the store's lost runs are the runner's), no run
id was submitted twice, no experiment failed, and that GitHub (the stand-in, counted by the bot's
own keys) shows each experiment's pull request, check run (per round and head commit) and
decision comment at most once, and a decision on every pull request. Utilisation and the ideal
count the slots the runner had (slot-seconds); a gap on a slot taken away meanwhile is no gap.
It exits 1 on a problem.

    .venv/bin/python bench/duty_cycle.py                 # K = 1 2 4 8 16, 10 experiments per slot (at least 30)
    .venv/bin/python bench/duty_cycle.py --soak          # K = 16, 10% of runs lost, slots 16-12-20-16-10-16
    .venv/bin/python bench/duty_cycle.py --quick         # K = 1 2, a few short experiments
    .venv/bin/python bench/duty_cycle.py --slots 4 --cprofile /tmp/conductor.prof
    .venv/bin/python bench/duty_cycle.py --slots 8 16 --actions  # as the Actions runner: its writes
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import itertools
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

REAL_BUDGET_S = 300.0  # what a job stands for: the h100 profile's budget
WORKFLOW = "autoresearch-train.yml"  # --actions: the workflow each run dispatches (.github/workflows)
SOAK_PLAN = "0.1:12,0.3:20,0.5:16,0.65:10,0.8:16"  # --soak: 4 slots taken away, 8 added, 10 away, back to 16
CHANGE = re.compile(r"^_sim_change_\d+ = ([-+0-9.e]+)$", re.MULTILINE)
BASE_VAL_BPB = 1.0


@dataclass
class Options:
    slots: int = 1
    experiments: int = 30
    scale: float = 100.0  # real seconds per bench second: a job sleeps 300 / scale
    agent_s: float | None = None  # one proposal, in bench seconds (None: 20 / scale)
    latency_ms: float = 100.0  # added to every GitHub REST call (not scaled)
    keep_share: float = 0.1  # proposals that are clear gains
    sigma: float = 0.002  # run-to-run noise of val_bpb
    seed: int = 0
    first_baseline_runs: int = 6
    baseline_runs: int = 2
    cprofile: str | None = None  # write the conductor thread's profile here
    write_share: float = 1.0  # GitHub's write limits times this (to bind them at the pace this machine reaches)
    timeout_s: float = 1800.0
    kill_share: float = 0.0  # runs the simulated runner loses mid-run (a runner taken away)
    slot_plan: tuple[tuple[float, int], ...] = ()  # (once this share of the experiments is decided, these slots)
    lookahead: int | None = None  # proposals prepared beyond the free slots (None: the conductor's own pacing)
    trace_tail: str | None = None  # write each tail gap here with the store's events around it (JSON lines)
    settings: tuple[tuple[str, str], ...] = ()  # more program.md settings (name, YAML value), e.g. remeasure_below
    actions: bool = False  # as the Actions runner: every branch pushed when proposed, a workflow dispatch per run

    @property
    def budget_s(self) -> float:
        return REAL_BUDGET_S / self.scale

    @property
    def think_s(self) -> float:
        return 20.0 / self.scale if self.agent_s is None else self.agent_s


# --- the simulated runner -------------------------------------------------------------------------


@dataclass
class Slot:
    run: int | None = None  # the run it holds now
    history: list[tuple[int, float, float, bool]] = field(default_factory=list)  # (run, start, end, baseline)


class SimRunner:
    """The Runner protocol with K slots: a job sleeps `budget_s` on a timer, then answers with a
    ResultSpec converted by bot.runners.specs.checked_result, and says so through on_change."""

    def __init__(
        self,
        slots: int,
        budget_s: float,
        identity: dict[str, str],
        sigma: float,
        seed: int,
        kill_share: float = 0.0,
    ) -> None:
        from runner.profiles import harness_hash

        self.slots = slots  # the conductor reads it at each dispatch; set_slots changes it
        self.kill_share = kill_share
        self.kills = random.Random(seed + 1)  # which runs are lost, and when
        self.lost: dict[int, str] = {}  # run id -> why, for the runs lost mid-run
        self.submissions: Counter = Counter()  # submit() calls per run id
        self.slot_changes: list[tuple[float, int]] = [(time.monotonic(), slots)]
        self.budget_s = budget_s
        self.identity = identity
        self.sigma = sigma
        self.seed = seed
        self.harness = harness_hash()
        self.slot = [Slot() for _ in range(slots)]
        self.jobs: dict[int, tuple[Any, int, float]] = {}  # run id -> (job, slot, start)
        self.results: dict[int, Any] = {}
        self.cancelled: set[int] = set()
        self.overbooked = 0  # submits that found no free slot (the conductor counts slots itself: never)
        self.dispatch: Callable[[Any], None] | None = None  # as the Actions runner: its workflow dispatch
        self._timers: dict[int, threading.Timer] = {}
        self._lock = threading.Lock()
        self._notify: Callable[[], None] | None = None

    def check_ready(self, identity: dict[str, str]) -> None:
        pass

    def on_change(self, callback: Callable[[], None]) -> None:
        self._notify = callback

    def notify(self) -> None:
        pass  # nothing outside tells of simulated jobs

    def close(self) -> None:
        pass  # the timers are daemons: they end with the bench

    def set_slots(self, slots: int) -> None:
        """Runners added or taken away while the bot runs: a slot taken away finishes its run."""
        with self._lock:
            self.slots = slots
            self.slot.extend(Slot() for _ in range(slots - len(self.slot)))
            self.slot_changes.append((time.monotonic(), slots))
        if self._notify is not None:
            self._notify()

    def submit(self, job: Any) -> str:
        with self._lock:
            self.submissions[job.run_id] += 1
            if job.run_id in self.jobs:
                return f"sim://{job.run_id}"
        if self.dispatch is not None:  # on the caller's thread, as bot.runners.actions dispatches
            self.dispatch(job)
        with self._lock:
            free = [i for i, s in enumerate(self.slot[: self.slots]) if s.run is None]
            if not free:
                self.overbooked += 1
                self.slot.append(Slot())
                free = [len(self.slot) - 1]
            index = free[0]
            self.slot[index].run = job.run_id
            self.jobs[job.run_id] = (job, index, time.monotonic())
            if self.kills.random() < self.kill_share:  # its runner is taken away part way through
                timer = threading.Timer(self.budget_s * self.kills.uniform(0.05, 0.95), self._lose, args=(job.run_id,))
            else:
                timer = threading.Timer(self.budget_s, self._finish, args=(job.run_id,))
            timer.daemon = True
            self._timers[job.run_id] = timer
            timer.start()
        return f"sim://{job.run_id}"

    def _finish(self, run_id: int) -> None:
        from bot.runners.specs import checked_result, job_spec
        from runner.protocol import Hashes, ResultSpec, RunnerIdentity, Timings

        with self._lock:
            if run_id in self.cancelled:
                return
            job, index, start = self.jobs[run_id]
            end = time.monotonic()
        spec = ResultSpec(
            run_id=job.run_id,
            experiment_id=job.experiment_id,
            status="ok",
            val_bpb=self.value(job.asset, job.seed),
            metrics={"num_steps": 1000, "simulated": True},
            timings=Timings(training=self.budget_s, training_wall=end - start, total=end - start),
            hashes=Hashes(asset=job.asset_sha256, harness=self.harness, data=self.identity["data_fingerprint"]),
            runner=RunnerIdentity(backend="sim", host=platform.node(), device="sim"),
            profile=job.profile,
            seed=job.seed,
        )
        result = checked_result(job_spec(job), spec, harness=self.harness)
        with self._lock:
            self.results[run_id] = result
            slot = self.slot[index]
            slot.run = None
            slot.history.append((run_id, start, end, job.experiment_id is None))
        if self._notify is not None:
            self._notify()

    def _lose(self, run_id: int) -> None:
        with self._lock:
            if run_id in self.cancelled:
                return
            job, index, start = self.jobs[run_id]
            self.lost[run_id] = "the simulated runner was taken away mid-run (a preempted container)"
            slot = self.slot[index]
            slot.run = None
            slot.history.append((run_id, start, time.monotonic(), job.experiment_id is None))
        if self._notify is not None:
            self._notify()

    def value(self, asset: str, seed: int) -> float:
        """main's value plus the asset's changes, plus seeded noise (same code and seed: same value)."""
        rng = random.Random(int(hashlib.sha256(asset.encode()).hexdigest()[:16], 16) ^ (seed * 7919) ^ self.seed)
        return round(BASE_VAL_BPB + sum(float(x) for x in CHANGE.findall(asset)) + rng.gauss(0.0, self.sigma), 6)

    def lookup(self, run_id: int) -> Any:
        from bot.core.records import RunStatus

        with self._lock:
            if run_id in self.results:
                return RunStatus("finished", result=self.results[run_id])
            if run_id in self.lost:
                return RunStatus("lost", detail=self.lost[run_id])
            if run_id not in self.jobs or run_id in self.cancelled:
                return RunStatus("unknown")
            start = self.jobs[run_id][2]
        done = min(1.0, (time.monotonic() - start) / self.budget_s)
        return RunStatus(
            "running",
            progress={
                "step": int(done * 1000),
                "loss": 3.0 - done,
                "progress": done,
                "remaining_seconds": (1 - done) * REAL_BUDGET_S,
            },
        )

    def cancel(self, run_id: int) -> None:
        with self._lock:
            if run_id in self.cancelled or run_id not in self.jobs or run_id in self.results or run_id in self.lost:
                return
            self.cancelled.add(run_id)
            self._timers[run_id].cancel()
            job, index, start = self.jobs[run_id]
            slot = self.slot[index]
            slot.run = None
            slot.history.append((run_id, start, time.monotonic(), job.experiment_id is None))


# --- the simulated agent --------------------------------------------------------------------------


class SimAgent:
    """Thinks `seconds`, then adds one new top-level constant to main's train.py: a clear gain
    (8 sigma) for a share `keep_share` of the proposals, a small loss for the rest (0 to 2 sigma);
    each text is distinct."""

    def __init__(self, seconds: float, keep_share: float, sigma: float, seed: int) -> None:
        self.seconds = seconds
        self.keep_share = keep_share
        self.sigma = sigma
        self.rng = random.Random(seed)
        self.count = 0
        self.asked: list[tuple[float, float]] = []  # (question, answer) times, monotonic
        self._lock = threading.Lock()  # several questions may be open at once

    def propose(self, ctx: Any) -> Any:
        from bot.core.records import Proposal

        asked = time.monotonic()
        time.sleep(self.seconds)
        with self._lock:
            self.asked.append((asked, time.monotonic()))
            self.count += 1
            count = self.count
            gain = self.rng.random() < self.keep_share
            effect = -8 * self.sigma if gain else self.rng.uniform(0.0, 2 * self.sigma)
        lines = ctx.asset.splitlines(keepends=True)
        # after a different top-level blank line each time: changes made on the same main merge
        # cleanly when one of them is kept first (all at the end of the file, they would conflict)
        spots = [i for i in range(len(lines) - 1) if not lines[i].strip() and lines[i + 1][:1] not in " \t\n#"]
        at = spots[count % len(spots)] + 1 if spots else len(lines)
        text = "".join([*lines[:at], f"_sim_change_{count} = {effect:.6f}\n", *lines[at:]])
        return Proposal(f"change {count}", f"{'a gain' if gain else 'a guess'} of {effect:+.4f}", text)


# --- the GitHub stand-in, in its own process --------------------------------------------------------


def standin_main(root: str, latency_ms: float, key_file: str) -> None:
    """The child: a GitHubStandIn with latency on every REST call; prints its URL, serves until
    stdin closes, then prints what it served."""
    from cryptography.hazmat.primitives import serialization
    from github_standin import GitHubStandIn

    files = {
        str(path.relative_to(Path(root) / "files")): path.read_text()
        for path in sorted((Path(root) / "files").rglob("*"))
        if path.is_file()
    }  # train.py and program.md, and with --actions the workflow
    public = serialization.load_pem_public_key(Path(key_file).read_bytes())
    with GitHubStandIn(
        Path(root) / "github", files=files, collaborators={"researcher": "admin"}, app_public_key=public
    ) as gh:
        # The stand-in has no latency knob (tests/github_standin/faults.py only fails requests),
        # so every call through its gateway is held here, without blocking the others.
        handle = gh.gateway.handle

        async def slow(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(latency_ms / 1000)
            return await handle(*args, **kwargs)

        gh.gateway.handle = slow  # type: ignore[method-assign]
        print(json.dumps({"api_url": gh.api_url}), flush=True)
        sys.stdin.read()
        requests = gh.requests
        print(
            json.dumps(
                {
                    "requests": len(requests),
                    "creating": sum(r.created for r in requests),
                    "methods": dict(Counter(r.method for r in requests)),
                    "dispatches": sum(1 for r in requests if r.path.endswith("/dispatches") and r.status < 300),
                    "violations": gh.violations[:5],
                    "violation_count": len(gh.violations),
                    "shown": shown(gh),
                }
            ),
            flush=True,
        )


def shown(gh: Any) -> dict[str, dict[str, int]]:
    """What the stand-in shows of each experiment, counted by the bot's own idempotency keys: pull
    requests by their body's marker (pr:<id>), check runs by external_id (autoresearch:<id>:<round>)
    and the commit they are on (an experiment re-grafted onto a newer main has a new head, which
    gets a check run of its own), decision comments by their marker (decision:<id>)."""
    from bot.github.render import find_marker

    def marked(kind: str, texts: list[str | None]) -> dict[str, int]:
        found = [find_marker(t) for t in texts]
        return dict(Counter(str(m[1]) for m in found if m is not None and m[0] == kind))

    pulls = gh.pulls()
    comments = [c["body"] for p in pulls for c in gh.comments(p["number"])]
    checks = [f"{c.get('external_id') or ''}@{c['head_sha'][:10]}" for c in gh.check_runs()]
    return {
        "prs": marked("pr", [p["body"] for p in pulls]),
        "checks": dict(Counter(x for x in checks if x.startswith("autoresearch:"))),
        "decisions": marked("decision", comments),
    }


class StandInProcess:
    def __init__(self, root: Path, latency_ms: float, key_file: Path) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--standin",
                str(root),
                "--latency-ms",
                str(latency_ms),
                "--key-file",
                str(key_file),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the GitHub stand-in did not start; see its output above")
        self.api_url = json.loads(line)["api_url"]

    def stop(self) -> dict[str, Any]:
        out, _ = self.proc.communicate(input="", timeout=60)
        return json.loads(out.strip().splitlines()[-1])


# --- the service, watched ---------------------------------------------------------------------------

# the tick's phases, as reported -> (the conductor's part, its method)
PHASES = {
    "read_main": ("baseline", "read"),
    "collect": ("runs", "collect"),
    "judge": ("lifecycle", "judge_all"),
    "_advance_all": ("lifecycle", "advance_all"),
    "schedule_baseline": ("baseline", "schedule"),
    "propose": ("proposals", "propose"),
    "dispatch": ("runs", "dispatch"),
}


def bench_service(opts: Options):
    """A Service that scales its clocks (timer, progress cadence, write pacer) and times each phase
    of every tick in the conductor thread."""
    from bot.app.serve import Service
    from bot.github.publisher import PROGRESS_EVERY_S, GitHubPublisher

    class BenchService(Service):
        ticks: list[dict[str, Any]]
        cpu: list[float]
        worker_s: float  # seconds the publishing worker spent publishing (its thread, not the conductor's)
        pacer: Any = None  # the client's write budget (bot.github.budget), on the scaled clock
        profiler: cProfile.Profile | None = None

        def _connect(self):
            conductor = super()._connect()
            if conductor is None:
                return None
            self.ticks, self.cpu, self.worker_s = [], [], 0.0
            if opts.lookahead is not None:
                conductor.proposals.lookahead = opts.lookahead
            # the longest a keep waits for its pull request, on the scaled clock; and each wait, timed
            gate = conductor.lifecycle.merge_wait
            gate.wait_s /= opts.scale
            self.gate_held: dict[int, list[float]] = {}  # experiment -> [first held, last held]
            holds = gate.holds

            def timed_holds(exp: Any) -> bool:
                held = holds(exp)
                if held:
                    now = time.monotonic()
                    self.gate_held.setdefault(exp.id, [now, now])[1] = now
                return held

            gate.holds = timed_holds
            # each forge call (a branch, a rebase) on the forge worker's thread: its wall and CPU seconds
            self.forge_calls: list[tuple[str, float, float]] = []
            calls = conductor.lifecycle.calls
            ask = calls.call

            def timed_call(key: Any, fn: Callable[..., Any]) -> Any:
                def timed_fn(forge: Any) -> Any:
                    started, cpu = time.monotonic(), time.thread_time()
                    try:
                        return fn(forge)
                    finally:
                        self.forge_calls.append((key[0], time.monotonic() - started, time.thread_time() - cpu))

                return ask(key, timed_fn)

            calls.call = timed_call
            # GitHub's write windows (80 a minute, 500 an hour) on the scaled clock
            self.pacer = self.client.budget
            self.pacer.clock = lambda: time.monotonic() * opts.scale
            self.pacer.sleep = lambda s: time.sleep(s / opts.scale)
            self.pacer.limits = tuple((w, max(1, round(n * opts.write_share))) for w, n in self.pacer.limits)
            worker = conductor.publishing.publishers if conductor.publishing else []  # GitHub's, off the tick
            github = next(p for p in [*conductor.publishers, *worker] if isinstance(p, GitHubPublisher))
            github.progress_every_s = PROGRESS_EVERY_S / opts.scale  # the product's cadence, scaled
            tick = conductor.tick

            def timed_tick() -> None:
                if opts.cprofile and self.profiler is None:
                    self.profiler = cProfile.Profile()
                    self.profiler.enable()  # this thread only: the conductor's
                record = {"start": time.monotonic(), "phases": []}
                self.ticks.append(record)
                tick()
                record["end"] = time.monotonic()

            def timed(name: str, step: Callable[..., Any]) -> Callable[..., Any]:
                def run(*args: Any, **kwargs: Any) -> Any:
                    started, cpu = time.monotonic(), time.thread_time()
                    try:
                        return step(*args, **kwargs)
                    finally:
                        if self.ticks:  # (name, start, end, the conductor thread's CPU seconds in it)
                            self.ticks[-1]["phases"].append((name, started, time.monotonic(), time.thread_time() - cpu))

                return run

            def on_worker(step: Callable[..., Any]) -> Callable[..., Any]:
                def run(*args: Any, **kwargs: Any) -> Any:
                    started = time.monotonic()
                    try:
                        return step(*args, **kwargs)
                    finally:
                        self.worker_s += time.monotonic() - started

                return run

            for name, (part, method) in PHASES.items():
                setattr(getattr(conductor, part), method, timed(name, getattr(getattr(conductor, part), method)))
            for publisher in conductor.publishers:
                publisher.publish = timed("publish", publisher.publish)
            for publisher in worker:  # on the publishing worker's thread: its own time, not a tick's
                publisher.publish = on_worker(publisher.publish)
            conductor.tick = timed_tick
            return conductor

        def _ticked(self, conductor: Any) -> None:
            super()._ticked(conductor)
            self.cpu.append(time.thread_time())  # the conductor thread's own CPU, read in that thread

    return BenchService


# --- one K --------------------------------------------------------------------------------------------


def actions_dispatch(client: Any) -> Callable[[Any], None]:
    """The write the Actions runner makes for each run (bot.runners.actions: the same request, charged
    to the same budget), against the stand-in: a workflow dispatch of the job's commit. Only the
    dispatch is simulated as the Actions runner does it; the run itself is the simulated runner's."""
    from urllib.parse import quote

    from bot.runners.actions import dispatch_inputs
    from bot.runners.specs import job_spec

    def dispatch(job: Any) -> None:
        if not job.commit:
            raise ValueError(f"run {job.run_id} has no commit: the Actions runner reads train.py from it")
        repo = client.repo()
        client.pace_write("dispatch")
        inputs = dispatch_inputs(job_spec(job))
        repo._requester.requestJsonAndCheck(
            "POST",
            f"{repo.url}/actions/workflows/{quote(WORKFLOW, safe='')}/dispatches",
            input={"ref": "main", "inputs": inputs, "return_run_details": True},
        )

    return dispatch


def program(opts: Options) -> str:
    return (
        f"---\nautoresearch:\n  first_baseline_runs: {opts.first_baseline_runs}\n"
        f"  baseline_runs: {opts.baseline_runs}\n  max_experiments: {opts.experiments}\n"
        + "".join(f"  {name}: {value}\n" for name, value in opts.settings)
        + "---\n\nLower val_bpb.\n"
    )


def run(opts: Options) -> dict[str, Any]:
    """One K: a fresh stand-in, service, runner and agent; the report of `report`. The caller's
    AUTORESEARCH_* settings are set aside meanwhile (a developer's token must not reach the bench)."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AUTORESEARCH_")}
    try:
        return _run(opts)
    finally:
        os.environ.update(saved)


def _run(opts: Options) -> dict[str, Any]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from bot.app.serve import Parts
    from bot.app.settings import load_service_settings
    from bot.core.states import State
    from bot.loop.proposals import paced_lookahead
    from bot.store import Store
    from runner.profiles import harness_hash

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    identity = {"profile": "h100", "harness_hash": harness_hash(), "data_fingerprint": "sim-data-1"}
    runner = SimRunner(opts.slots, opts.budget_s, identity, opts.sigma, opts.seed, opts.kill_share)
    agent = SimAgent(opts.think_s, opts.keep_share, opts.sigma, opts.seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "files").mkdir()
        (root / "files" / "train.py").write_text((ROOT / "train.py").read_text())
        (root / "files" / "program.md").write_text(program(opts))
        if opts.actions:
            (root / "files" / ".github" / "workflows").mkdir(parents=True)
            (root / "files" / ".github" / "workflows" / WORKFLOW).write_text(
                (ROOT / ".github" / "workflows" / WORKFLOW).read_text()
            )
        key_file = root / "app.pub"
        key_file.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        gh = StandInProcess(root, opts.latency_ms, key_file)
        served: dict[str, Any] = {}
        try:
            settings = load_service_settings(
                repository="octo-org/research",
                github_api_url=gh.api_url,
                poll=True,
                state_dir=root / "state",
                profile="h100",
                github_app_id=1,
                github_private_key=pem,
                **({"runner": "actions", "data_fingerprint": identity["data_fingerprint"]} if opts.actions else {}),
            )

            def make_parts(s: Any, client: Any, t: Any) -> Any:
                if opts.actions:
                    runner.dispatch = actions_dispatch(client)
                return Parts(runner, agent, dict(identity))

            service = bench_service(opts)(settings, make_parts=make_parts, timer_s=30.0 / opts.scale)
            main_cpu0, cpu0, started = time.thread_time(), time.process_time(), time.monotonic()
            wall_offset = time.time() - time.monotonic()  # the store's times are the wall clock's
            service.start()
            store = Store(settings.state_dir / "state.db")
            plan = list(opts.slot_plan)
            paced: list[int] = []  # the conductor's own lookahead, sampled as it runs
            while True:
                exps = store.experiments.all()
                if opts.lookahead is None:
                    run_s = store.runs.recent_length_s()
                    paced.append(
                        paced_lookahead(
                            runner.slots,
                            store.runs.recent_ready_s(),
                            run_s,
                            lambda horizon_s, run_s=run_s: store.runs.ending_within(horizon_s, run_s or 0.0),
                        )
                    )
                decided = sum(e.state == State.DONE for e in exps) / opts.experiments
                while plan and decided >= plan[0][0]:  # runners added or taken away while the bot runs
                    runner.set_slots(plan.pop(0)[1])
                if len(exps) == opts.experiments and all(
                    e.state == State.DONE and store.published.get(e.id).get("final") == e.status for e in exps
                ):
                    break
                if time.monotonic() - started > opts.timeout_s:
                    raise SystemExit(
                        f"K={opts.slots}: timed out after {opts.timeout_s:.0f}s with "
                        f"{sum(e.state == State.DONE for e in exps)} of {opts.experiments} done; "
                        f"conductor: {service.status}"
                    )
                time.sleep(0.25)
            wall = time.monotonic() - started
            process_cpu = time.process_time() - cpu0 - (time.thread_time() - main_cpu0)
            service.stop()
            if service.profiler is not None:
                service.profiler.disable()
                service.profiler.dump_stats(opts.cprofile)
            runs = store.runs.all()
            statuses = Counter(e.status for e in exps)
            events = [(e["at"] - wall_offset, e["experiment_id"], e["kind"], e["message"]) for e in store.events.all()]
            # the ledger keeps the last hour (on the scaled clock): the writes GitHub counts at the end, by kind
            last_hour = Counter(
                f"{'research' if w.research else 'people'}: {w.what}" for w in store.writes.since(float("-inf"))
            )
        finally:
            served = gh.stop()
    row = report(opts, runner, agent, service, runs, statuses, wall, process_cpu, served)
    spans = row.pop("_tail_spans")
    if wall * opts.scale >= 3600:  # an hour of scaled time has passed: the ledger holds a whole one
        row["writes_last_hour"] = sum(last_hour.values())
        row["writes_last_hour_by_kind"] = dict(last_hour.most_common())
    if opts.trace_tail:
        with open(opts.trace_tail, "a") as sink:
            for slot, end, start, next_purpose in sorted(spans, key=lambda s: s[1]):
                around = [
                    f"{at - end:+.2f}s {kind} #{exp}: {message[:120]}"
                    for at, exp, kind, message in events
                    if end - opts.budget_s * 0.1 <= at <= start
                ]
                line = {"K": opts.slots, "slot": slot, "end": round(end - started, 2), "gap_s": round(start - end, 3)}
                sink.write(json.dumps(line | {"next": next_purpose, "events": around}) + "\n")
    if paced:
        row["lookahead_paced_p50_max"] = [sorted(paced)[len(paced) // 2], max(paced)]
    if opts.kill_share or opts.slot_plan:
        row["soak"] = soak_check(runner, exps, runs, served.get("shown", {}))
    return row


def soak_check(runner: SimRunner, exps: list[Any], runs: list[Any], shown: dict[str, dict[str, int]]) -> dict[str, Any]:
    """What must hold after runs were lost and slots came and went; each problem is one line."""
    problems: list[str] = []
    ids = [e.id for e in exps]
    if len(ids) != len(set(ids)) or any(e.state != "done" for e in exps):
        problems.append("an experiment is not done, or appears twice")
    codes = [e.code_hash for e in exps]
    if len(codes) != len(set(codes)):
        problems.append("two experiments share a train.py")
    rerun_of = {r.rerun_of for r in runs if r.rerun_of is not None}
    lost = [r for r in runs if r.state == "lost"]
    never_again = [r.id for r in lost if r.id not in rerun_of]
    if never_again:
        problems.append(f"lost runs never run again: {never_again}")
    if {r.id for r in lost} != set(runner.lost):
        problems.append(
            f"the store's lost runs {sorted(r.id for r in lost)} are not the runner's {sorted(runner.lost)}"
        )
    # the bench stops once every experiment is decided: main's own runs may still be in flight then
    left = [r.id for r in runs if r.state in ("queued", "running") and r.experiment_id is not None]
    if left:
        problems.append(f"runs of decided experiments left queued or running: {left}")
    twice = [run_id for run_id, n in runner.submissions.items() if n > 1]
    if twice:
        problems.append(f"runs submitted more than once: {twice}")
    failed = [e.id for e in exps if e.status == "failed"]
    if failed:
        problems.append(f"experiments failed: {failed}")
    for kind, counts in shown.items():
        many = {k: n for k, n in counts.items() if n > 1}
        if many:
            problems.append(f"{kind} shown more than once: {many}")
    without = [e.id for e in exps if str(e.id) not in shown.get("prs", {})]
    undecided = [
        e.id for e in exps if str(e.id) in shown.get("prs", {}) and str(e.id) not in shown.get("decisions", {})
    ]
    if undecided:
        problems.append(f"pull requests without their decision comment: {undecided}")
    heads_by_exp = Counter(key.split(":")[1] for key in shown.get("checks", {}))
    return {
        "experiments": len(exps),
        "runs": len(runs),
        "lost": len(lost),
        "lost_then_done": sum(1 for r in runs if r.rerun_of in {x.id for x in lost} and r.state == "done"),
        "slot_changes": [n for _, n in runner.slot_changes],
        "overbooked": runner.overbooked,
        "prs": len(shown.get("prs", {})),
        "without_pr": without,
        "check_runs": sum(shown.get("checks", {}).values()),
        "experiments_checked_on_two_heads_or_more": sum(1 for n in heads_by_exp.values() if n > 1),
        "main_runs_in_flight_at_the_stop": sum(1 for r in runs if r.state in ("queued", "running")),
        "decision_comments": sum(shown.get("decisions", {}).values()),
        "problems": problems,
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(
    opts: Options,
    runner: SimRunner,
    agent: SimAgent,
    service: Any,
    runs: list[Any],
    statuses: Counter,
    wall: float,
    process_cpu: float,
    served: dict[str, Any],
) -> dict[str, Any]:
    k, budget = opts.slots, opts.budget_s
    history = [(i, *h) for i, slot in enumerate(runner.slot) for h in slot.history]
    starts = sorted(start for _, _, start, _, _ in history)
    first_exp = min(start for _, _, start, _, baseline in history if not baseline)
    window = (first_exp, starts[-1])
    span = window[1] - window[0]

    def busy(baseline: bool, within: tuple[float, float] = window) -> float:
        return sum(
            max(0.0, min(end, within[1]) - max(start, within[0])) for _, _, start, end, b in history if b == baseline
        )

    purpose = {r.id: r.purpose for r in runs}
    experiment_of = {r.id: r.experiment_id for r in runs}
    last_end: dict[int, float] = {}  # an experiment is over when its last run ends
    for _, run_id, _, end, _ in history:
        exp = experiment_of.get(run_id)
        if exp is not None:
            last_end[exp] = max(last_end.get(exp, 0.0), end)
    # steady state: completions between the a-th and the b-th, leaving out the ramp and the drain
    done = sorted(last_end.values())
    a, b = max(0, min(k, len(done) // 10) - 1), len(done) - 1 - max(0, min(k, len(done) // 10) - 1)
    exp_per_h = (b - a) / (done[b] - done[a]) * 3600 / opts.scale if b > a and done[b] > done[a] else float("nan")
    capacity = slot_seconds(runner.slot_changes, *window)  # k * span while the slots stay k
    steady = (done[a], done[b]) if b > a else window
    steady_capacity = slot_seconds(runner.slot_changes, *steady)
    mean_slots = capacity / span if span > 0 else k
    ideal = mean_slots * 3600 / REAL_BUDGET_S

    # the drain: once the agent has been asked its last question (the bench's N experiments), a slot
    # that frees waits for whatever the judge still wants; in service the agent would be asked again
    last_question = max((q[0] for q in agent.asked), default=float("inf"))
    gaps, parts, steady_gaps = [], Counter(), []
    each: list[tuple[float, Counter, str]] = []  # (gap, where it went, the purpose of the run that ended it)
    spans: list[tuple[int, float, float]] = []  # (slot, end, start) of each gap, as `each`
    ticks = [t for t in service.ticks if "end" in t]
    for index, slot in enumerate(runner.slot):
        seq = sorted(slot.history, key=lambda h: h[1])
        for (_, _, end, _), (next_run, start, _, _) in itertools.pairwise(seq):
            if fewest_slots(runner.slot_changes, end, start) <= index:
                continue  # the slot was taken away meanwhile: no runner waited
            gap = start - end
            gaps.append(gap)
            if end < last_question:
                steady_gaps.append(gap)
            where = gap_parts(end, start, ticks)
            parts.update(where)
            each.append((gap, where, purpose.get(next_run, "?")))
            spans.append((index, end, start))
    # the tail: the gaps at or past the 90th percentile, where the p95 comes from
    cut = percentile(gaps, 0.9) if gaps else 0.0
    tail = [g for g in each if g[0] >= cut] if gaps else []
    tail_spans = [span for span, g in zip(spans, each, strict=True) if gaps and g[0] >= cut]
    tail_parts: Counter = Counter()
    tail_phases: Counter = Counter()  # the dispatching tick's phases before the run started: wall, CPU
    for _, where, _ in tail:
        tail_parts.update(where)
    for _, _, start in tail_spans:
        for t in ticks:
            if t["start"] < start <= t["end"]:
                for name, a, b, cpu in t["phases"]:
                    if b <= start:
                        tail_phases[f"{name} wall"] += b - a
                        tail_phases[f"{name} cpu"] += cpu
    tick_time = Counter()
    for t in ticks:
        for name, a, b, _ in t["phases"]:
            tick_time[name] += b - a
    n = sum(statuses.values())
    counts = Counter(purpose.get(run_id, "?") for _, run_id, _, _, _ in history)
    # the proposal pipeline (one question at a time): between an answer and the next question the
    # agent waits for the conductor (a tick to take the answer, the next to ask again)
    asked = [q for q in agent.asked if window[0] <= q[0] <= window[1]]
    between = [b[0] - a[1] for a, b in itertools.pairwise(asked)]
    conductor_cpu = (service.cpu[-1] - service.cpu[0]) if len(service.cpu) > 1 else float("nan")
    return {
        "K": k,
        "experiments": n,
        "statuses": dict(statuses),
        "wall_s": round(wall, 1),
        "runs": dict(counts),
        "runs_per_experiment": round(sum(c for p, c in counts.items() if p != "baseline") / n, 2),
        "window_s": round(span, 2),
        "exp_per_h": round(exp_per_h, 1),
        "ideal_per_h": round(ideal, 1),
        "share_of_ideal": round(exp_per_h / ideal, 3),
        "utilisation": round((busy(False) + busy(True)) / capacity, 3) if span > 0 else None,
        "utilisation_experiments": round(busy(False) / capacity, 3) if span > 0 else None,
        "utilisation_steady": (
            round((busy(False, steady) + busy(True, steady)) / steady_capacity, 3) if steady_capacity > 0 else None
        ),
        "utilisation_baselines": round(busy(True) / capacity, 3) if span > 0 else None,
        "gap_n": len(gaps),
        "gap_p50": round(percentile(gaps, 0.5) / budget, 4),
        "gap_p95": round(percentile(gaps, 0.95) / budget, 4),
        "gap_max": round(max(gaps, default=0) / budget, 4),
        "gap_before_drain_n": len(steady_gaps),
        "gap_before_drain_p95": round(percentile(steady_gaps, 0.95) / budget, 4),
        "gap_before_drain_max": round(max(steady_gaps, default=0) / budget, 4),
        "gap_p50_s": round(percentile(gaps, 0.5), 3),
        "gap_p95_s": round(percentile(gaps, 0.95), 3),
        "gap_parts_s": {name: round(v / max(1, len(gaps)), 3) for name, v in parts.items()},
        "gap_tail_n": len(tail),
        "gap_tail_parts_s": {name: round(v / max(1, len(tail)), 3) for name, v in tail_parts.most_common()},
        "gap_tail_next_run": dict(Counter(p for _, _, p in tail)),
        "gap_tail_dispatching_tick_s": {name: round(v / max(1, len(tail)), 3) for name, v in tail_phases.most_common()},
        "_tail_spans": [(*span, g[2]) for span, g in zip(tail_spans, tail, strict=True)],
        "cpu_per_exp": round(process_cpu / n, 3),
        "conductor_cpu_per_exp": round(conductor_cpu / n, 3),
        "ticks": len(ticks),
        "tick_s_per_exp": {name: round(v / n, 3) for name, v in tick_time.most_common()},
        "publishing_worker_s_per_exp": round(service.worker_s / n, 3),
        "agent_busy": round(sum(b - a for a, b in asked) / span, 3) if span > 0 else None,
        "agent_answer_to_next_ask_s": round(sum(between) / len(between), 3) if between else None,
        "proposals_per_budget": round(len(asked) / span * budget, 2) if span > 0 else None,
        "api_requests_per_exp": round(served.get("requests", 0) / n, 1),
        "api_creating_per_exp": round(served.get("creating", 0) / n, 1),
        "api_writes_per_h": round(served.get("creating", 0) / (wall * opts.scale) * 3600, 1),
        "forge_calls": {
            kind: {
                "n": len(done),
                "wall_ms": round(1000 * sum(w for _, w, _ in done) / len(done), 1),
                "cpu_ms": round(1000 * sum(c for _, _, c in done) / len(done), 1),
            }
            for kind in sorted({k for k, _, _ in service.forge_calls})
            for done in [[c for c in service.forge_calls if c[0] == kind]]
        },
        "merge_gate_holds": len(service.gate_held),
        "merge_gate_held_real_s_max": round(
            max((b - a for a, b in service.gate_held.values()), default=0) * opts.scale, 1
        ),
        "merge_gate_held_real_s_sum": round(sum(b - a for a, b in service.gate_held.values()) * opts.scale, 1),
        "write_mode": service.pacer.mode.mode if service.pacer else None,
        "pacer_waited_s": round(service.pacer.waited / opts.scale, 2) if service.pacer else None,
        "violations": served.get("violation_count"),
        "overbooked": runner.overbooked,
        "submitted": len(runner.submissions),  # runs the runner was given (each once: submissions counts repeats)
        "cancelled_running": len(runner.cancelled),  # runs stopped after they started: slot time that bought nothing
        "workflow_dispatches": served.get("dispatches"),  # --actions: the workflow runs GitHub accepted
        "scale": opts.scale,
        "budget_s": budget,
        "agent_s": opts.think_s,
        "latency_ms": opts.latency_ms,
        "lookahead": opts.lookahead,
        "settings": dict(opts.settings),
    }


def slot_seconds(changes: list[tuple[float, int]], start: float, end: float) -> float:
    """The runner's slots integrated over [start, end], from its (time, slots) changes."""
    total = 0.0
    for (at, slots), (until, _) in itertools.pairwise([*changes, (float("inf"), 0)]):
        total += slots * max(0.0, min(until, end) - max(at, start))
    return total


def fewest_slots(changes: list[tuple[float, int]], start: float, end: float) -> int:
    """The fewest slots the runner had at any time in [start, end]."""
    live = [
        slots
        for (at, slots), (until, _) in itertools.pairwise([*changes, (float("inf"), 0)])
        if at <= end and until >= start
    ]
    return min(live, default=changes[-1][1])


def gap_parts(end: float, start: float, ticks: list[dict[str, Any]]) -> Counter:
    """Where one idle gap went: the tick running when the job ended still had to finish (named by
    its longest phase after the end), ticks that came and dispatched nothing to it (no run was
    ready: a proposal, a branch or a judgement was still to come), and the dispatching tick's own
    work before dispatch: before its early dispatch (right after collecting), or, for a run started
    by its last dispatch, also its advancing and proposing."""
    out: Counter = Counter()
    cursor = end
    for t in ticks:
        if t["end"] <= end or t["start"] >= start:
            continue
        if t["start"] <= end:  # in progress when the job ended
            later = [(b - max(a, end), name) for name, a, b, _ in t["phases"] if b > end]
            name = max(later)[1] if later else "tick"
            out[f"running tick ({name})"] += min(t["end"], start) - end
            cursor = min(t["end"], start)
        elif t["end"] < start:  # a whole tick that did not start it
            out["nothing ready"] += t["end"] - cursor
            cursor = t["end"]
        else:  # the dispatching tick
            out["waiting for a tick"] += t["start"] - cursor
            early = next((b for name, _, b, _ in t["phases"] if name == "dispatch"), t["end"])
            if start <= early:  # the early dispatch, right after collecting
                out["dispatching tick before dispatch"] += start - t["start"]
            else:  # the tick's last dispatch: after advancing and proposing (a baseline, or a run queued in the tick)
                out["dispatching tick before dispatch"] += early - t["start"]
                out["late dispatch (after advancing, proposing)"] += start - early
            cursor = start
    if cursor < start:
        out["other"] += start - cursor
    return out


# --- the command ----------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'K':>3} {'exps':>5} {'runs/exp':>8} {'exp/h':>7} {'ideal':>6} {'of ideal':>8} {'steady':>6} {'util':>6} "
        f"{'util exp':>8} {'gap p50':>8} {'gap p95':>8} {'gap max':>8} {'p95 bd':>7} {'max bd':>7} "
        f"{'cpu/exp':>8} {'cond cpu':>8} "
        f"{'api/exp':>7} {'wr/exp':>6} {'wr/h':>6} {'mode':>8} {'pacer s':>7}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['K']:>3} {r['experiments']:>5} {r['runs_per_experiment']:>8.2f} {r['exp_per_h']:>7.1f} "
            f"{r['ideal_per_h']:>6.0f} {r['share_of_ideal']:>8.1%} "
            f"{r['utilisation_steady'] or 0:>6.1%} {r['utilisation']:>6.1%} "
            f"{r['utilisation_experiments']:>8.1%} {r['gap_p50']:>8.2%} {r['gap_p95']:>8.2%} "
            f"{r['gap_max']:>8.2%} {r['gap_before_drain_p95']:>7.2%} {r['gap_before_drain_max']:>7.2%} "
            f"{r['cpu_per_exp']:>8.3f} {r['conductor_cpu_per_exp']:>8.3f} "
            f"{r['api_requests_per_exp']:>7.1f} {r['api_creating_per_exp']:>6.1f} {r['api_writes_per_h']:>6.0f} "
            f"{r['write_mode']:>8} {r['pacer_waited_s']:>7.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="the values of K")
    parser.add_argument("--per-slot", type=int, default=10, help="experiments per slot (at least --min-experiments)")
    parser.add_argument("--min-experiments", type=int, default=30)
    parser.add_argument(
        "--scale",
        type=float,
        default=100.0,
        help="real seconds per bench second: a job sleeps 300/scale s, the agent 20/scale s",
    )
    parser.add_argument("--agent-s", type=float, help="one proposal, in bench seconds (default 20/scale)")
    parser.add_argument("--latency-ms", type=float, default=100.0, help="added to every GitHub REST call")
    parser.add_argument("--keep-share", type=float, default=0.1)
    parser.add_argument("--first-baseline-runs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cprofile", help="write the conductor thread's cProfile here (the last K run)")
    parser.add_argument(
        "--write-share",
        type=float,
        default=1.0,
        help="GitHub's write limits (500 an hour, 80 a minute) times this: a loaded machine reaches a share "
        "of the ideal pace, and the same share of the limits binds as the whole would at the ideal",
    )
    parser.add_argument(
        "--quick", action="store_true", help="K = 1 2, 4 experiments of 1 s (scale 300), 2 first baselines"
    )
    parser.add_argument(
        "--soak",
        action="store_true",
        help=f"K = 16, runs lost mid-run (--kill-share 0.1) and slots changed ({SOAK_PLAN}), then checked",
    )
    parser.add_argument("--kill-share", type=float, default=0.0, help="runs the simulated runner loses mid-run")
    parser.add_argument(
        "--actions",
        action="store_true",
        help="as the Actions runner: every branch pushed when proposed, and a workflow dispatch per run",
    )
    parser.add_argument(
        "--slot-plan",
        default="",
        help="slots changed while it runs: SHARE:SLOTS,... (once SHARE of the experiments is decided, SLOTS slots)",
    )
    parser.add_argument(
        "--lookahead",
        type=int,
        help="proposals prepared beyond the free slots (default: the conductor's pacing, bot.loop.proposals)",
    )
    parser.add_argument("--trace-tail", help="append each tail gap, with the store's events around it, to this file")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a program.md setting, e.g. remeasure_below=1.25",
    )
    parser.add_argument("--standin", help=argparse.SUPPRESS)
    parser.add_argument("--key-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.standin:
        return standin_main(args.standin, args.latency_ms, args.key_file)
    if args.quick:
        args.slots, args.per_slot, args.min_experiments, args.scale, args.first_baseline_runs = [1, 2], 2, 4, 300.0, 2
    if args.soak:
        args.slots, args.kill_share, args.slot_plan = [16], args.kill_share or 0.1, args.slot_plan or SOAK_PLAN
    try:
        plan = tuple((float(a), int(n)) for a, n in (x.split(":") for x in args.slot_plan.split(",") if x))
    except ValueError:
        parser.error("--slot-plan is SHARE:SLOTS,... (a share of the experiments decided, then the slots), e.g. 0.2:12")
    if any(n < 1 for _, n in plan) or not 0 <= args.kill_share < 1:
        parser.error("every slot count in --slot-plan must be at least 1, and --kill-share in [0, 1)")
    if any("=" not in item for item in args.set):
        parser.error("--set is NAME=VALUE, a program.md setting, e.g. remeasure_below=1.25")
    settings = tuple(tuple(item.split("=", 1)) for item in args.set)
    think = 20.0 / args.scale if args.agent_s is None else args.agent_s
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.node()} {os.cpu_count()} cores, python "
        f"{platform.python_version()}; job {REAL_BUDGET_S / args.scale:g} s = {REAL_BUDGET_S:.0f} s, agent "
        f"{think:g} s, latency {args.latency_ms:g} ms per GitHub call, scale {args.scale:g}",
        flush=True,
    )
    rows = []
    for k in args.slots:
        opts = Options(
            slots=k,
            experiments=max(args.min_experiments, args.per_slot * k),
            scale=args.scale,
            agent_s=args.agent_s,
            latency_ms=args.latency_ms,
            keep_share=args.keep_share,
            seed=args.seed,
            first_baseline_runs=args.first_baseline_runs,
            cprofile=args.cprofile,
            write_share=args.write_share,
            kill_share=args.kill_share,
            slot_plan=plan,
            lookahead=args.lookahead,
            trace_tail=args.trace_tail,
            settings=settings,
            actions=args.actions,
        )
        row = run(opts)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(table(rows))
    soaks = [(r["K"], r["soak"]) for r in rows if "soak" in r]
    for k, soak in soaks:
        print(f"soak K={k}: " + ", ".join(f"{key} {json.dumps(v)}" for key, v in soak.items() if key != "problems"))
        print(f"soak K={k}: {len(soak['problems'])} problems" + "".join(f"\n  - {p}" for p in soak["problems"]))
    if any(soak["problems"] for _, soak in soaks):
        sys.exit(1)


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # the project first: tests/bot (a directory, no package) must not shadow bot/
    sys.path.append(str(ROOT / "tests"))  # the GitHub stand-in
    main()
