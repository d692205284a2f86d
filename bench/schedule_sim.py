"""The real conductor on simulated time: a fake runner, a fake agent and an injected clock.

`simulate()` drives bot.loop.conductor.Conductor itself, unchanged (baseline, proposals,
lifecycle, runs, the judge), through one trajectory of a research loop, as fast as the CPU allows:

- the clock is a number the driver moves: to the end of the next run, never by sleeping;
- the runner (`SimRunner`) has K slots; a run ends `budget` seconds after it started, times
  1 + U(0, `jitter`), and its val_bpb is main's true value plus the true effects its train.py
  carries, plus the drift of the measurement at its start, plus noise from a `NoiseModel`, drawn in
  the order the conductor starts runs. With a seed share `rho`, that noise is
  sqrt(rho) z_seed + sqrt(1 - rho) z_run: z_seed is drawn once per run seed and per model (what the
  seed decides: the initial weights), shared by every run of that seed whose train.py has the same
  parameters and draws them the same way; with `fingerprints` the runner reports the parameters'
  fingerprint as the scorer does (runner.score), so the judge may pair runs by seed;
- the agent (`EffectAgent`) proposes main's train.py with one line added, `_effect_<n> = <x>`,
  whose x is the change's true effect (the runner reads these lines), each at its own place so
  that a change made on an older main re-grafts cleanly onto a newer one; a simplification (the
  changes the caller names) deletes the spare code main's first train.py holds at its place and
  writes its effect line there instead, so train.py gets smaller as bot.core.simplicity counts it
  and the judge's simplicity rule applies (without simplifications train.py has no spare code); a
  change among `reshapes` writes `_reshape_<n> = <x>` (it changes the model's parameters: a new
  fingerprint and new initial weights under every seed), one among `decorrelated` writes
  `_decor_<n> = <x>` (it keeps the parameters but draws them otherwise: the same fingerprint, new
  initial weights);
- the agent answers at once: the conductor asks it on its real thread (bot.loop.agent_worker),
  and the driver waits for the answer and ticks again, as the real driver does when woken;
- a tick happens after every answer and at every run's end, as the real driver's wakes make it;
- the forge is bot.forge.memory.MemoryForge and the store SQLite in memory (`cheap=True`), or
  the local git forge and a store file (`cheap=False`, for the check that the cheap pieces change
  nothing the conductor does: tests/bench/test_schedule_sim.py).

Effects and noise are in units of sigma, the run-to-run standard deviation (`SIGMA` in val_bpb).
What a trajectory did comes back as a `Trajectory`: every experiment with its true effect and
verdict (and whether it was a simplification, kept for simplicity), every run with the main it
measured against and whether main had moved by its end, a trace of runs started and verdicts given,
in order, and the paired pool's degrees of freedom at the end (bot.loop.pairing.PairedPool).
"""

from __future__ import annotations

import math
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bot.core.protocols import AgentStopped, Forge
from bot.core.records import Job, Proposal, ProposalContext, RunResult, RunStatus
from bot.core.states import State
from bot.loop.conductor import Conductor, ConductorConfig
from bot.store import Store

SIGMA = 0.001  # run-to-run standard deviation of val_bpb, the unit of every effect here
BASE_VAL_BPB = 1.0
BUDGET_S = 300.0  # a run, in simulated seconds (the h100 profile's budget)
IDENTITY = {"profile": "h100", "harness_hash": "sim-harness", "data_fingerprint": "sim-data"}
SPOTS = 128  # places in train.py where a change adds its line; more than the experiments ever in flight
EFFECT_LINE = re.compile(r"^_(?:effect|reshape|decor)_\d+ = ([-+0-9.e]+)$", re.M)
RESHAPE_LINE = re.compile(r"^_reshape_\d+", re.M)  # a change of the model's parameters
DECOR_LINE = re.compile(r"^_decor_\d+", re.M)  # the same parameters, drawn otherwise under a seed


def params_fingerprint(asset: str) -> str:
    """What the scorer would report of a simulated train.py: main's first parameters, plus each
    change of them it holds."""
    return "params:" + ",".join(sorted(RESHAPE_LINE.findall(asset)))


def initial_weights(asset: str) -> str:
    """What a run's seed decides of a simulated train.py: its parameters and how they are drawn."""
    return params_fingerprint(asset) + "|" + ",".join(sorted(DECOR_LINE.findall(asset)))


def spare_code(place: int) -> str:
    """Code at a place that a simplification deletes: two statements (6 code tokens), where the one
    line it writes in their stead, its effect, has one line and 3-4 tokens."""
    return f"_spare_{place} = 1\n_spare_{place} += 1\n"


def sim_train_py(spare_places: frozenset[int] = frozenset()) -> str:
    """Main's first train.py: a place per change, and spare code at the places of simplifications.
    Places are comment lines, which the loop's checks never parse: the asset each proposal is
    validated with stays a few statements long."""
    places = "".join(f"# place {k}\n" + (spare_code(k) if k in spare_places else "") for k in range(SPOTS))
    return "from runner import harness\n\nh = harness.session()\n" + places + "h.finish(None)\n"


SIM_TRAIN_PY = sim_train_py()  # a loop without simplifications


def program_md(max_experiments: int, **settings: object) -> str:
    lines = "".join(f"  {key}: {value}\n" for key, value in {"max_experiments": max_experiments, **settings}.items())
    return f"---\nautoresearch:\n{lines}---\n\n# Research program\n\nLower val_bpb.\n"


# --- what the world is like: effects of changes and noise of runs ---------------------------------


@dataclass(frozen=True)
class Effects:
    """A distribution of the true effects of proposed changes, in sigma (negative is better)."""

    name: str
    description: str
    null: float  # share of changes with no effect
    harmful: float  # share that hurt, by Exponential(mean harm) sigma
    harm: float
    helpful_gains: tuple[float, ...] = ()  # the rest help by one of these gains, equally likely...
    help_mean: float = 0.0  # ...or, when no gains are listed, by Exponential(mean help_mean) sigma

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        kind, size = rng.random(n), rng.exponential(1.0, n)
        if self.helpful_gains:
            gain = np.asarray(self.helpful_gains)[rng.integers(0, len(self.helpful_gains), n)]
        else:
            gain = self.help_mean * rng.exponential(1.0, n)
        return np.where(kind < self.null, 0.0, np.where(kind < self.null + self.harmful, self.harm * size, -gain))


EFFECTS = {
    # The default: an agent editing a tuned train.py. Most edits break something, often clearly
    # (karpathy's own run kept 22 of 126 with no margin at all); a fifth do nothing measurable; a
    # fifth help, by 1, 2 or 3 sigma.
    "mixed": Effects(
        "mixed",
        "20% no effect; 60% harmful, +Exponential(mean 4 sigma); 20% helpful, a gain of 1, 2 or 3 sigma equally likely",
        null=0.2,
        harmful=0.6,
        harm=4.0,
        helpful_gains=(1.0, 2.0, 3.0),
    ),
    # A harder world: half the edits do nothing and the helpful ones are mostly small, so few
    # keeps are possible and false keeps weigh more among them.
    "sparse": Effects(
        "sparse",
        "50% no effect; 30% harmful, +Exponential(mean 2 sigma); 20% helpful, -Exponential(mean 1.5 sigma)",
        null=0.5,
        harmful=0.3,
        harm=2.0,
        help_mean=1.5,
    ),
}


@dataclass(frozen=True)
class NoiseModel:
    """How one run's value strays from its code's true value, in sigma: a draw per run from
    `kind` (unit standard deviation), and the measurement's drift, a random walk shared by every
    run with a step of `drift` sigma per `budget` of time (taken at the run's start)."""

    name: str
    description: str
    kind: str  # gauss | t3 | outliers
    drift: float = 0.0
    outlier_share: float = 0.05
    outlier_size: float = 4.0

    def draw(self, rng: np.random.Generator) -> float:
        if self.kind == "t3":
            return float(rng.standard_t(3)) / math.sqrt(3.0)  # t(3) has variance 3
        value = float(rng.standard_normal())
        if self.kind == "outliers" and rng.random() < self.outlier_share:
            value += self.outlier_size  # a slow neighbour, a throttled device: fewer steps, a worse value
        return value


NOISE = {
    "gauss": NoiseModel("gauss", "Gaussian", "gauss"),
    "t3": NoiseModel("t3", "Student-t(3), scaled to unit standard deviation", "t3"),
    "outliers": NoiseModel("outliers", "Gaussian, 5% of runs worse by 4 sigma", "outliers"),
    "drift": NoiseModel("drift", "Gaussian, plus a random walk of 0.15 sigma per run's time", "gauss", drift=0.15),
}


# --- the simulated pieces -------------------------------------------------------------------------


class SimClock:
    """The conductor's clock: a number that only the driver moves."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class SimJob:
    job: Job
    start: float
    end: float
    value: float
    cancelled: bool = False


class SimRunner:
    """The Runner protocol on a SimClock: `slots` slots, a run ends at its start + `budget_s` x
    (1 + U(0, jitter)) with the value of its train.py as `value_of` says, plus noise."""

    def __init__(
        self,
        slots: int,
        clock: SimClock,
        rng: np.random.Generator,
        noise: NoiseModel,
        *,
        budget_s: float = BUDGET_S,
        jitter: float = 0.02,
        rho: float = 0.0,
        fingerprints: bool = False,
    ) -> None:
        self.slots = slots
        self.rho = rho
        self.fingerprints = fingerprints
        self.seed_draws: dict[tuple[str, int], float] = {}  # (initial weights, seed) -> z_seed
        self.seed_rng = rng.spawn(1)[0]  # apart from the runs' draws, which it leaves as they were
        self.clock = clock
        self.rng = rng
        self.noise = noise
        self.budget_s = budget_s
        self.jitter = jitter
        self.jobs: dict[int, SimJob] = {}
        self.level = 0.0  # the measurement's drift now, in sigma
        self._level_at = clock.now

    def check_ready(self, identity: dict[str, str]) -> None:
        pass

    def on_change(self, callback: Callable[[], None]) -> None:
        pass  # the driver knows when runs end: it moves the clock there

    def notify(self) -> None:
        pass

    def close(self) -> None:
        pass

    def submit(self, job: Job) -> str:
        if job.run_id not in self.jobs:
            now = self.clock()
            if self.noise.drift:
                elapsed = (now - self._level_at) / self.budget_s
                self.level += self.noise.drift * math.sqrt(elapsed) * float(self.rng.standard_normal())
                self._level_at = now
            effects = sum(float(x) for x in EFFECT_LINE.findall(job.asset))
            noise = self.noise.draw(self.rng)
            if self.rho:
                weights = (initial_weights(job.asset), job.seed)
                if weights not in self.seed_draws:
                    self.seed_draws[weights] = float(self.seed_rng.standard_normal())
                noise = math.sqrt(self.rho) * self.seed_draws[weights] + math.sqrt(1 - self.rho) * noise
            value = BASE_VAL_BPB + SIGMA * (effects + self.level + noise)
            end = now + self.budget_s * (1.0 + self.jitter * float(self.rng.random()))
            self.jobs[job.run_id] = SimJob(job, now, end, value)
        return f"sim://{job.run_id}"

    def lookup(self, run_id: int) -> RunStatus:
        sim = self.jobs.get(run_id)
        if sim is None or sim.cancelled:
            return RunStatus("unknown")
        if self.clock() < sim.end:
            return RunStatus("running", progress={"progress": (self.clock() - sim.start) / (sim.end - sim.start)})
        return RunStatus("finished", result=result_for(sim.job, sim.value, fingerprint=self.fingerprints))

    def cancel(self, run_id: int) -> None:
        if run_id in self.jobs:
            self.jobs[run_id].cancelled = True
            self.jobs[run_id].end = min(self.jobs[run_id].end, self.clock())

    def next_end(self) -> float | None:
        """When the next running run ends (None: nothing runs)."""
        now = self.clock()
        ends = [j.end for j in self.jobs.values() if not j.cancelled and j.end > now]
        return min(ends) if ends else None


def result_for(job: Job, value: float, *, fingerprint: bool = False) -> RunResult:
    metrics = dict(IDENTITY, asset_sha256=job.asset_sha256, val_bpb=value, num_steps=1000, clock="cuda", seed=job.seed)
    if fingerprint:
        metrics["params_fingerprint"] = params_fingerprint(job.asset)
    return RunResult(run_id=job.run_id, status="ok", val_bpb=value, metrics=metrics, log_tail="simulated")


class EffectAgent:
    """Proposes main's train.py with one line added that carries the next true effect (in sigma);
    change n goes after the line `# place <n mod SPOTS>`, so two changes in flight never touch the
    same place. A simplification (its position in `simplifications`) instead writes its effect line
    in place of the spare code at its place: train.py gets a line and 2-3 code tokens smaller."""

    # it answers at once in simulated time: one question at a time gives each experiment the next
    # effect in order, so a trajectory is determined by its seed (asked at once, by the threads)
    questions_at_once = 1

    def __init__(
        self,
        effects: list[float],
        simplifications: frozenset[int] = frozenset(),
        reshapes: frozenset[int] = frozenset(),
        decorrelated: frozenset[int] = frozenset(),
    ) -> None:
        self.effects = effects
        self.simplifications = simplifications
        self.reshapes = reshapes
        self.decorrelated = decorrelated
        self.asked = 0

    def propose(self, ctx: ProposalContext) -> Proposal:
        n = self.asked
        if n >= len(self.effects):
            raise AgentStopped("no more changes")
        self.asked += 1
        kind = "reshape" if n in self.reshapes else "decor" if n in self.decorrelated else "effect"
        line = f"_{kind}_{n + 1} = {self.effects[n]!r}\n"
        if n in self.simplifications:
            spare = spare_code(n % SPOTS)
            if spare not in ctx.asset:
                raise RuntimeError(f"simplification {n + 1} found no spare code at place {n % SPOTS} to delete")
            asset = ctx.asset.replace(spare, line, 1)
            return Proposal(f"simplification {n + 1}", f"true effect {self.effects[n]:+.3f} sigma, less code", asset)
        anchor = f"\n# place {n % SPOTS}\n"
        asset = ctx.asset.replace(anchor, f"{anchor}{line}", 1)
        return Proposal(f"change {n + 1}", f"true effect {self.effects[n]:+.3f} sigma", asset)


# --- one trajectory -------------------------------------------------------------------------------


@dataclass
class SimRun:
    id: int
    purpose: str
    experiment: int | None
    start: float
    end: float
    moved: bool  # main was no longer the main it measured against when it ended (or was cancelled)


@dataclass
class SimExperiment:
    id: int
    effect: float  # true, in sigma
    status: str | None
    delta: float | None  # as judged, in sigma
    remeasured_delta: float | None  # in sigma
    simpler: bool = False  # proposed as a simplification: it deletes code
    kept_for_simplicity: bool = False  # kept by the judge's simplicity rule, not as a gain
    keeps_parameters: bool = True  # its train.py keeps main's parameters (not among `reshapes`)
    paired: bool = False  # its verdict was the judge's paired rule's


@dataclass
class Trajectory:
    experiments: list[SimExperiment]
    runs: list[SimRun]
    # (time, "run", purpose, experiment) for each run started, (time, "verdict", experiment, status)
    # for each experiment ended, in the order the ticks did them
    trace: list[tuple] = field(default_factory=list)
    ticks: int = 0
    paired_dof: int = 0  # the paired pool's degrees of freedom at the loop's end (0: no pool yet)


def simulate(
    effects: list[float],
    *,
    slots: int = 1,
    noise: NoiseModel = NOISE["gauss"],
    seed: int | tuple[int, ...] = 0,
    lookahead: int | None = None,
    until: int | None = None,
    cheap: bool = True,
    workdir: Path | None = None,
    jitter: float = 0.02,
    simplifications: frozenset[int] = frozenset(),
    settings: dict[str, object] | None = None,
    rho: float = 0.0,
    fingerprints: bool = False,
    reshapes: frozenset[int] = frozenset(),
    decorrelated: frozenset[int] = frozenset(),
) -> Trajectory:
    """One loop of len(effects) experiments whose true effects (sigma) are `effects`, in proposal
    order; the changes at the (0-based) positions in `simplifications` delete code, those in
    `reshapes` change the model's parameters, those in `decorrelated` keep them but draw them
    otherwise (see SimRunner for `rho` and `fingerprints`). `settings`: more
    of program.md's front matter (simplicity_sigmas...). `until`: stop once that experiment has its
    verdict (the probes of experiment 1). `cheap=False` runs the local git forge and a store file in
    `workdir` (a temporary one if None)."""
    if simplifications and len(effects) > SPOTS:
        raise ValueError(f"simplifications need a place of their own: at most {SPOTS} experiments, not {len(effects)}")
    agent = EffectAgent(effects, simplifications, reshapes, decorrelated)
    with tempfile.TemporaryDirectory(prefix="schedule-sim-") as tmp:
        work = workdir or Path(tmp)
        files = {
            "train.py": sim_train_py(frozenset(n % SPOTS for n in simplifications)),
            "program.md": program_md(len(effects), **(settings or {})),
        }
        forge: Forge
        if cheap:
            from bot.forge.memory import MemoryForge

            forge, store = MemoryForge(files), Store(Path(":memory:"))
        else:
            from bot.forge.local import init_research_repo

            forge, store = init_research_repo(work / "repo", files), Store(work / "state.db")
        try:
            runner_options = dict(jitter=jitter, rho=rho, fingerprints=fingerprints)
            return _drive(forge, store, agent, slots, noise, seed, lookahead, until, runner_options)
        finally:
            store.close()


def _drive(
    forge: Forge,
    store: Store,
    agent: EffectAgent,
    slots: int,
    noise: NoiseModel,
    seed: int | tuple[int, ...],
    lookahead: int | None,
    until: int | None,
    runner_options: dict[str, Any],
) -> Trajectory:
    clock = SimClock()
    runner = SimRunner(slots, clock, np.random.default_rng(seed), noise, **runner_options)
    # the store's times are the wall clock's, not this simulated one, so the conductor's own pacing
    # of the lookahead (bot.loop.proposals) would follow how fast this machine runs the simulation:
    # one per slot unless asked, as the conductor does before it has a pace
    config = ConductorConfig(
        profile=IDENTITY["profile"], identity=dict(IDENTITY), lookahead=slots if lookahead is None else lookahead
    )
    conductor = Conductor(store, forge, runner, agent, config, clock=clock)
    answered = threading.Event()
    conductor.wake_on(answered.set)
    worker = conductor.proposals.worker
    mains: list[tuple[float, str]] = []  # (time, sha): main as each tick left it
    trace: list[tuple] = []
    seen_runs: set[int] = set()
    decided: set[int] = set()
    tick = 0
    while True:
        answered.clear()
        conductor.tick()
        tick += 1
        sha = forge.main_sha()
        if not mains or mains[-1][1] != sha:
            mains.append((clock.now, sha))
        for run_id in sorted(set(runner.jobs) - seen_runs):
            seen_runs.add(run_id)
            run = store.runs.get(run_id)
            trace.append((clock.now, "run", run.purpose, run.experiment_id))
        for exp_id, status in store.db.execute(
            "SELECT id, status FROM experiments WHERE state = ? ORDER BY id", (State.DONE,)
        ):
            if exp_id not in decided:
                decided.add(exp_id)
                trace.append((clock.now, "verdict", exp_id, status))
        if conductor.finished() or (until is not None and until in decided):
            break
        proposing = store.experiments.in_state(State.PROPOSING)
        if proposing and not conductor.stop_reason and (proposing[0].retry_at or 0) <= clock.now:
            # the agent answers at once, on its own thread: tick again once it has (a question not
            # yet asked, its last thread still ending, is asked by that tick)
            if worker.busy(proposing[0].id):
                answered.wait(timeout=10)
            continue
        wake = runner.next_end() or _next_retry(store, clock.now)  # a backoff running out: the driver's timer
        if wake is None:
            raise RuntimeError(f"the simulated loop stalled at tick {tick}: nothing runs, waits or is asked")
        clock.now = wake
    error = store.db.execute("SELECT message FROM events WHERE kind = 'error' ORDER BY id LIMIT 1").fetchone()
    if error is not None:  # figures from a loop whose phases failed would measure the failure
        raise RuntimeError(f"the conductor failed in a simulated loop: {error[0]}")
    pool = conductor.baseline.paired_pool().noise()
    return Trajectory(_experiments(store, agent), _runs(store, runner, mains), trace, tick, pool.dof if pool else 0)


def _next_retry(store: Store, now: float) -> float | None:
    retries = [e.retry_at for e in store.experiments.active() if e.retry_at and e.retry_at > now]
    return min(retries) if retries else None


def _experiments(store: Store, agent: EffectAgent) -> list[SimExperiment]:
    found = []
    for exp in store.experiments.all():
        if not exp.title:  # withdrawn while proposing
            continue
        n = int(exp.title.split()[-1])
        found.append(
            SimExperiment(
                id=exp.id,
                effect=agent.effects[n - 1],
                status=exp.status,
                delta=None if exp.delta is None else exp.delta / SIGMA,
                remeasured_delta=None if exp.remeasured_delta is None else exp.remeasured_delta / SIGMA,
                simpler=n - 1 in agent.simplifications,
                kept_for_simplicity=exp.status == "keep" and "kept_for_simplicity" in exp.meta,
                keeps_parameters=n - 1 not in agent.reshapes,
                paired="seed for seed" in (exp.reason or ""),
            )
        )
    return found


def _runs(store: Store, runner: SimRunner, mains: list[tuple[float, str]]) -> list[SimRun]:
    def main_at(time: float) -> str:
        """Main as the tick at `time` found it: moved by ticks strictly before."""
        sha = mains[0][1]
        for at, moved_to in mains:
            if at >= time:
                break
            sha = moved_to
        return sha

    found = []
    for run_id, sim in sorted(runner.jobs.items()):
        run = store.runs.get(run_id)
        found.append(
            SimRun(run_id, run.purpose, run.experiment_id, sim.start, sim.end, main_at(sim.end) != run.base_sha)
        )
    return found
