"""What counts as a measurement: the identity a work directory measures under, whether one
runner's result may count for the run it claims to answer, and which finished runs make main's
value, the noise and the margin now.

The identity (profile, harness hash, data fingerprint, and on a CPU-clock profile the allotted
thread count, because that budget is CPU time per thread) is pinned in the store when a conductor
starts. A result counts only if it answers its run id, measured exactly the queued train.py, and
carries that identity; a CPU run that got far less of its cores than main's recent runs did says
more about a busy machine than about its train.py and is run once more.

Of the finished runs, those that count are ok, carry a val_bpb and were measured under the pinned
identity (`counted`). Main's value is the mean of its own baseline runs (`main_values`): a kept
experiment's runs were selected for coming out low, so they feed the noise (`noise`) but never
main's value. Two kinds of runs of main say more about the machine than about main and are left
out of its value (`main_runs`), so that main is measured again: a run worse than the rest by more
than the noise allows (`outlier`: a slow neighbour, a throttled device), and, once main's runs
move with the loop's run order (`drift`), every run older than the loop's last RECENT_RUNS. The
noise keeps every run: a sigma trimmed of the runs that came out worst would be too small for
noise with heavy tails both ways (measured in bench/decision_accuracy.py's t(3) noise). Which runs
pair with main's under the same seed is bot.loop.pairing's. The baseline of a loop is its first
main's value as the judge last compared against it (`baseline_value`). Everything here is pure: the
conductor decides what to do with the answers, and every view (bot.views.read_model) shows the same
numbers because it asks the same functions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from bot.core.records import RunResult, asset_sha256
from bot.loop.judge import JudgeConfig, Noise, margin, pooled_noise, t_multiplier
from bot.store import Experiment, Run, Store

IDENTITY_KEYS = ("profile", "harness_hash", "data_fingerprint")
OUTLIER_Z = 3.09  # a run of main this much worse than the rest (one-sided 0.1%, Student-t) is set aside
DRIFT_Z = 2.576  # main's runs drift when their trend over run order is this significant (two-sided 1%)
RECENT_RUNS = 20  # once main drifts, it is judged against its runs among the loop's last this many
OPTIONAL_KEYS = ("threads", "task")  # task: runner.tasks's, in every identity but training's


class WrongProfile(RuntimeError):
    """The work directory measures another profile; the message says what to do."""


def pinned_threads(identity: dict[str, Any]) -> int | None:
    value = identity.get("threads")
    return None if value is None else int(value)


def refuse_other_profile(pinned: str | None, profile: str) -> None:
    """Raise WrongProfile when a work directory pinned to `pinned` is asked to measure `profile`."""
    if pinned and pinned != profile:
        raise WrongProfile(
            f"this work directory measures with profile {pinned!r}, not {profile!r}: their numbers "
            f"do not compare. Use --profile {pinned} here, or another --workdir for {profile!r}."
        )


def pin(store: Store, identity: dict[str, Any]) -> list[str]:
    """Fix `identity` for the work directory of `store`; returns what changed, in words (also
    recorded as events). Another profile is refused: its numbers never compare. A changed harness,
    data set or thread count is accepted and starts a new baseline, because earlier runs no longer
    count."""
    current = {k: str(identity[k]) for k in IDENTITY_KEYS}
    current.update({k: str(identity[k]) for k in OPTIONAL_KEYS if k in identity})
    stored = store.state.identity
    if not stored:
        store.state.identity = current
        store.events.add(None, "identity", "measuring under " + ", ".join(f"{k} {v}" for k, v in current.items()))
        return []
    refuse_other_profile(stored.get("profile") or "?", current["profile"])
    changed = [
        f"{k} {stored.get(k)} -> {current[k]}"
        for k in (*IDENTITY_KEYS[1:], *OPTIONAL_KEYS)
        if k in current and stored.get(k) != current[k]
    ]
    if not changed:
        return []
    message = (
        f"the measurement changed ({'; '.join(changed)}): earlier runs no longer count, main is measured "
        "afresh and open experiments are measured again"
    )
    store.state.identity = current
    store.events.add(None, "identity", message)
    return [message]


class MeasuredRun(Protocol):
    """What the rules read of a run: a store Run, or a lighter row with the same fields."""

    experiment_id: int | None
    purpose: str
    code_hash: str
    state: str
    status: str | None
    val_bpb: float | None
    profile: str
    harness_hash: str | None
    data_fingerprint: str | None
    metrics: dict[str, Any]


R = TypeVar("R", bound=MeasuredRun)


class Value(NamedTuple):
    """One counted run's val_bpb: the code_hash of the train.py it measured, its experiment (None for a
    run of main) and why it ran (`baseline` for main's own runs). store.runs.measured_values gives the
    same tuples."""

    code_hash: str
    experiment: int | None
    purpose: str
    val_bpb: float


def measured_under(run: MeasuredRun, identity: dict[str, Any]) -> bool:
    """Whether a finished run was measured under `identity`."""
    threads = pinned_threads(identity)
    return (
        run.profile == identity["profile"]
        and run.harness_hash == identity["harness_hash"]
        and run.data_fingerprint == identity["data_fingerprint"]
        and (threads is None or run.metrics.get("clock") != "cpu" or run.metrics.get("threads") == threads)
    )


def counted_runs(runs: Iterable[R], identity: dict[str, Any]) -> list[R]:
    """Which runs count toward a measurement, in the order given (run id): finished ok with a
    val_bpb, measured under `identity` (before any identity is pinned, every such run)."""
    return [
        r
        for r in runs
        if r.state == "done"
        and r.status == "ok"
        and r.val_bpb is not None
        and (not identity or measured_under(r, identity))
    ]


def counted(runs: Iterable[MeasuredRun], identity: dict[str, Any]) -> list[Value]:
    """The values of `counted_runs`."""
    return [Value(r.code_hash, r.experiment_id, r.purpose, r.val_bpb) for r in counted_runs(runs, identity)]


class Drift(NamedTuple):
    """Main's runs move with time: their least-squares slope, in val_bpb per run of the loop, its t
    statistic against the pooled noise, and how many of main's runs it was measured on."""

    slope: float
    t: float
    runs: int


class MainRuns(NamedTuple):
    """Main's own runs as the judge reads them: `values`, the val_bpb it is judged against; `outlier`,
    a run set aside for being worse than the rest by more than the noise allows (None if none);
    `drift`, how its runs move with the loop's run order when they move (None if they do not);
    `positions`, where each of `values` is in the values given."""

    values: list[float]
    outlier: float | None
    drift: Drift | None
    positions: tuple[int, ...] = ()


def main_runs(
    values: Sequence[tuple[str, int | None, str, float]], code_hash: str, found: Noise | None = None
) -> MainRuns:
    """Main's own baseline runs for the train.py whose hash is `code_hash` (those queued beside a
    confirmation included; a kept experiment's runs never count: they were selected), less those
    that say more about the machine than about main:

    - an outlier (`outlier`): the one run worse than the rest of main's runs by more than the noise
      allows, which would raise main's value and make false keeps;
    - once main's runs move with time (`drift`), every run older than the loop's last RECENT_RUNS.

    Main then has fewer values than it wants and baseline.schedule measures it again. `found` is the
    pooled noise of `values` (`noise`), computed here when not given."""
    own = [(i, v) for i, (c, _, purpose, v) in enumerate(values) if c == code_hash and purpose == "baseline"]
    if len(own) < 2 or (found := noise(values) if found is None else found) is None:
        return MainRuns([v for _, v in own], None, None, tuple(i for i, _ in own))
    set_aside = None
    worst = outlier([v for _, v in own], found)
    if worst is not None:
        set_aside = own.pop(worst)[1]
    moving = drift(own, found)
    if moving is not None:
        own = [(i, v) for i, v in own if i >= len(values) - RECENT_RUNS]
    return MainRuns([v for _, v in own], set_aside, moving, tuple(i for i, _ in own))


def main_values(
    values: Sequence[tuple[str, int | None, str, float]], code_hash: str, found: Noise | None = None
) -> list[float]:
    """Main's val_bpb values for the train.py whose hash is `code_hash`: the values of `main_runs`."""
    return main_runs(values, code_hash, found).values


def main_value(values: Sequence[tuple[str, int | None, str, float]], code_hash: str) -> float | None:
    """Main's val_bpb as the judge compares against it now: the mean of `main_values`. While a
    drifting main has no run recent enough (it is being measured afresh), its latest run: what people
    are shown (the summary, the views, the target) is main as last measured, never nothing."""
    own = main_values(values, code_hash) or [v for c, _, p, v in values if c == code_hash and p == "baseline"][-1:]
    return statistics.fmean(own) if own else None


def outlier(group: Sequence[float], found: Noise, z: float = OUTLIER_Z) -> int | None:
    """The index of the run of `group` (repeated runs of one train.py, part of the pooled noise
    `found`) that is worse than the others by more than the noise allows, or None.

    The test is the externally studentized residual: the run's distance above the mean of the
    others, over the standard error of that distance with sigma pooled without this run's share
    (found's sum of squares less n/(n-1) e^2, on dof - 1 degrees of freedom). Under Gaussian noise
    it follows Student-t, so a run is set aside with probability P(Z > z) (0.1%) whatever the
    degrees of freedom. One-sided, because a disturbance (a slow neighbour, a throttled device)
    makes a run worse, never better; of a pair, the worse run is the one suspected."""
    n = len(group)
    if n < 2 or found.dof < 2:
        return None
    mean = statistics.fmean(group)
    squares = found.sigma**2 * found.dof
    best: tuple[float, int] | None = None
    for index, value in enumerate(group):
        share = n / (n - 1) * (value - mean) ** 2
        rest = squares - share
        if value <= mean or rest <= 0:
            continue
        score = math.sqrt(share / (rest / (found.dof - 1)))
        if score > t_multiplier(z, found.dof - 1) and (best is None or score > best[0]):
            best = (score, index)
    return None if best is None else best[1]


def drift(runs: Sequence[tuple[int, float]], found: Noise, z: float = DRIFT_Z) -> Drift | None:
    """How main's runs, (position in the loop's run order, val_bpb), move with time, or None when
    they do not: the least-squares slope of val_bpb on position is tested against the pooled noise
    that the trend leaves (found's sum of squares, which holds these runs, less slope^2 * Sxx, on
    dof - 1 degrees of freedom): t = slope * sqrt(Sxx) / that sigma follows Student-t under no
    drift, so at two-sided `z` a main that does not move is called drifting in 1% of tests. Main's first runs all start together, so the test speaks once main has runs spread
    over the loop (those queued beside confirmations, or measured afresh)."""
    if len(runs) < 3:
        return None
    mean_at = statistics.fmean(i for i, _ in runs)
    mean = statistics.fmean(v for _, v in runs)
    spread = sum((i - mean_at) ** 2 for i, _ in runs)
    if spread == 0:
        return None
    slope = sum((i - mean_at) * (v - mean) for i, v in runs) / spread
    rest = found.sigma**2 * found.dof - slope**2 * spread  # the pooled squares the trend leaves
    if found.dof < 2 or rest <= 0:
        return None
    t = slope * math.sqrt(spread / (rest / (found.dof - 1)))
    if abs(t) <= t_multiplier(z, found.dof - 1):
        return None
    return Drift(slope, t, len(runs))


def first_main(values: Iterable[tuple[str, int | None, str, float]]) -> str | None:
    """The code_hash of the first main measured under the pinned identity: the loop's baseline."""
    return next((c for c, _, purpose, _ in values if purpose == "baseline"), None)


def is_first_main(values: Iterable[tuple[str, int | None, str, float]], code_hash: str) -> bool:
    """Whether `code_hash` is the first main measured under the pinned identity (no other code has a
    baseline run that counts), so the noise will rest on its runs alone (judge.main_runs_wanted)."""
    return not any(c != code_hash for c, _, purpose, _ in values if purpose == "baseline")


def noise(values: Iterable[tuple[str, int | None, str, float]]) -> Noise | None:
    """The run-to-run noise, pooled over groups of repeated runs of the same code: each main's own
    runs, each experiment's runs. A kept experiment's runs stay apart from its new main's runs:
    they were selected for coming out low."""
    groups: dict[tuple[str, int | None], list[float]] = {}
    for code_hash, experiment, purpose, value in values:
        groups.setdefault((code_hash, None if purpose == "baseline" else experiment), []).append(value)
    return pooled_noise(groups.values())


def main_margin(
    values: Sequence[tuple[str, int | None, str, float]], code_hash: str, config: JudgeConfig
) -> float | None:
    """The noise margin now: the improvement one candidate run must show against main's runs of the
    train.py whose hash is `code_hash`; None while main has no run or the noise is not known."""
    own = main_values(values, code_hash)
    found = noise(values)
    return margin(found, 1, len(own), config) if found and own else None


def baseline_value(values: Sequence[tuple[str, int | None, str, float]], kept: Iterable[Experiment]) -> float | None:
    """The loop's baseline: the first main's val_bpb as the judge last compared against it. Once a
    keep replaced it, that is the value the keep was judged against (its meta `main_val_bpb`, for
    meta `main_code` the first main): a run of the old main that finished later (the one queued
    beside a confirmation) changed no decision. While it is still main, its `main_value`."""
    first = first_main(values)
    if first is None:
        return None
    for exp in kept:
        judged = exp.meta.get("main_val_bpb")
        if exp.meta.get("main_code") == first and isinstance(judged, (int, float)):
            return float(judged)
    return main_value(values, first)


def refusal(run: Run, result: RunResult, identity: dict[str, Any]) -> str | None:
    """Why `result` may not count for `run`, or None: it must answer this job, with this code,
    measured under the pinned identity."""
    if result.run_id != run.id:
        return f"it answers run {result.run_id}, not run {run.id}"
    if "seed" in result.metrics and result.metrics["seed"] != run.seed:
        return f"it ran with seed {result.metrics['seed']}, not run {run.id}'s seed {run.seed}"
    reported = result.metrics.get("asset_sha256")
    if reported and reported != asset_sha256(run.asset):
        return "it measured another train.py than the one queued (asset sha256 differs)"
    if result.status != "ok":
        return None  # a crash carries no identity to compare: it counts as this train.py's crash
    if not reported:
        return "it does not say which train.py it measured (no asset_sha256)"
    for key in IDENTITY_KEYS:
        if result.metrics.get(key) != identity[key]:
            return f"its {key} is {result.metrics.get(key)!r} but this work directory measures under {identity[key]!r}"
    threads = pinned_threads(identity)
    if threads is not None and result.metrics.get("clock") == "cpu" and result.metrics.get("threads") != threads:
        return (
            f"it ran on {result.metrics.get('threads')} CPU threads but this work directory measures with "
            f"{threads} (its budget is CPU time per thread)"
        )
    return None


def disturbance(run: Run, result: RunResult, recent_main_runs: list[Run], share_floor: float) -> str | None:
    """Why this run's number says more about a busy machine than about its train.py, or None.

    A CPU run's budget is CPU time, but a neighbour still slows it (caches, memory bandwidth). One
    that got less than `share_floor` of the CPU share main's recent runs got is run again, once: a
    re-run counts whatever it gets, so a machine that stays busy cannot stall the loop. A run whose
    training the work clock ended (runner.work) trained the steps it would have on a quiet machine,
    however slowly: it is not run again. That word is train.py's claim, but a run that lies it only
    keeps a slowed run's number, which a re-run could only have improved."""
    share = result.metrics.get("cpu_share")
    if result.status != "ok" or run.rerun_of is not None or result.metrics.get("clock") != "cpu" or not share:
        return None
    extra = result.metrics.get("extra")
    if isinstance(extra, dict) and extra.get("ended_by_work") is True:
        return None
    shares = [s for s in (r.metrics.get("cpu_share") for r in recent_main_runs) if s]
    if not shares:
        return None
    usual = statistics.median(shares)
    if share < share_floor * usual:
        return (
            f"disturbed: it got {share:.0%} of its CPU cores against {usual:.0%} for main's recent runs "
            "(another process was busy on this machine)"
        )
    return None
