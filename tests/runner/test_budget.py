"""The budget has one clock, the supervisor's: a train.py that trains past it, by whatever route,
is stopped at its cap (budget + allowance on the profile's clock, from the hand-over of the job)
and its run is rejected; the honest train.py ends inside the cap.

Each attack runs through `run_job` on the smoke profile with a tiny model, sandboxed where this
machine can make a sandbox and unsandboxed where it cannot (the clock is the same either way).
The supervisor's copy of the profile gets a shorter budget so that an attack costs seconds; the
training process never sees the supervisor's limits. Nothing here compares val_bpb: only what is
sure (a status, a bound on the time measured outside the training process).

`make test` runs one attack (the budget replaced by train.py's own) to its cap; every other attack,
the orphan that trains, the hard limit and the honest train.py are the slow tier: each is a run of
its own to the cap or the limit, and the cap is what is under test.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from runner import profiles, sandbox
from runner.isolated import run_job
from runner.protocol import JobSpec, ResultSpec

REPO = Path(__file__).resolve().parents[2]
SESSION = """
import time, torch
from runner import harness
h = harness.session()
"""
MODEL = """
class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(h.vocab_size, 8)
        self.out = torch.nn.Linear(8, h.vocab_size)
    def forward(self, idx):
        return self.out(self.embed(idx))

model = Tiny()

def train(seconds):
    '''Train for `seconds` of this process's CPU time, whatever the harness says.'''
    start = time.process_time()
    while time.process_time() - start < seconds:
        x = torch.randn(256, 256)
        x @ x
"""
# A sampling interval of the supervisor (0.1 s) on 2 cores per allotted thread, and its own delays
# on a busy machine: how far past the cap a stopped process may have got.
STOP_SLACK_S = 1.0
THREADS = 1  # allotted to each run
LONG_S = 60.0  # far more than any cap below: an attack that is not stopped runs into the test's timeout


@pytest.fixture
def short_budget(monkeypatch: pytest.MonkeyPatch) -> profiles.Profile:
    """The supervisor's smoke profile with a 0.5 s budget (a cap of 3 s on one thread), for attacks
    that cost seconds."""
    smoke = profiles.PROFILES["smoke"]
    short = dataclasses.replace(smoke, time_budget_s=0.5, allowance_s=2.5, export_margin_s=1.0)
    monkeypatch.setitem(profiles.PROFILES, "smoke", short)
    return short


def run(tmp_path: Path, asset: str, name: str = "run") -> ResultSpec:
    job = JobSpec(run_id=1, asset=asset, profile="smoke", seed=0)
    return run_job(job, tmp_path / name, threads=THREADS)


def assert_stopped_at_the_cap(result: ResultSpec, profile: profiles.Profile) -> None:
    assert result.status == "rejected", (result.status, result.error)
    assert "past the budget" in result.error and result.val_bpb is None
    cap = profile.cap_s(THREADS)
    assert cap <= result.metrics["training_seconds"] <= cap + STOP_SLACK_S, result.metrics


ATTACKS = {
    # its own, longer budget in place of the harness's
    "replaced_time_up": SESSION
    + MODEL
    + f"""
started = time.process_time()
h.time_up = lambda: time.process_time() - started > {LONG_S}
h.progress = lambda: 0.0
while not h.time_up():
    train(0.05)
    h.step_done(1.0)
h.finish(model)
""",
    # the harness's clocks wound back, and the time module's clocks patched, at every step
    "clock_wound_back": SESSION
    + MODEL
    + f"""
real = time.process_time
started = real()
time.process_time = lambda: 0.0
time.time = lambda: 0.0
while real() - started < {LONG_S}:
    train(0.05)
    h._origin_cpu = h._cpu_clock()
    h._origin_wall = h._wall_clock()
    h.training_seconds = 0.0
    h.step_done(1.0)
h.finish(model)
""",
    # the warm-up steps were not counted once: one very long first step
    "trains_in_a_warm_up_step": SESSION
    + MODEL
    + f"""
train({LONG_S})
h.step_done(1.0)
h.finish(model)
""",
    # finish() exports, and the export used to fall in the start-up allowance
    "trains_inside_finish": SESSION
    + MODEL
    + f"""
import runner.harness
export = runner.harness.export_model
def slow_export(*args, **kwargs):
    train({LONG_S})
    return export(*args, **kwargs)
runner.harness.export_model = slow_export
h.finish(model)
""",
    "trains_after_finish": SESSION
    + MODEL
    + f"""
h.finish(model)
train({LONG_S})
""",
    # before the session is opened: start-up, which used to be free up to the allowance
    "trains_before_the_session": "import time, torch\n"
    + f"""
start = time.process_time()
while time.process_time() - start < {LONG_S}:
    x = torch.randn(256, 256)
    x @ x
"""
    + SESSION
    + MODEL
    + "h.finish(model)\n",
    # more threads than the one allotted: the budget burns faster, it does not grow
    "threads_beyond_the_allotment": SESSION
    + MODEL
    + f"""
torch.set_num_threads(4)
started = time.time()
while time.time() - started < {LONG_S}:
    x = torch.randn(512, 512)
    x @ x
h.finish(model)
""",
}


FAST_ATTACK = "replaced_time_up"  # the one attack `make test` runs


@pytest.mark.parametrize(
    "attack", [name if name == FAST_ATTACK else pytest.param(name, marks=pytest.mark.slow) for name in sorted(ATTACKS)]
)
def test_training_past_the_budget_is_stopped_at_the_cap_and_rejected(
    smoke_prepared, tmp_path: Path, short_budget, attack: str
) -> None:
    """Slow tier, all but FAST_ATTACK: each attack trains to the supervisor's cap on its real clock,
    a run of its own."""
    result = run(tmp_path, ATTACKS[attack])
    assert_stopped_at_the_cap(result, short_budget)


DETACHED = (
    SESSION
    + MODEL
    + f"""
import os
if os.fork() == 0:  # a double fork: the grandchild is an orphan at once, and trains
    if os.fork() == 0:
        train({LONG_S})
        open("done", "w").close()
    os._exit(0)
os.wait()
while not os.path.exists("done"):
    time.sleep(0.1)
h.finish(model)
"""
)


@pytest.mark.slow
@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
def test_a_detached_process_that_trains_counts_on_the_clock(
    smoke_prepared, tmp_path: Path, short_budget, sandboxed: bool
) -> None:
    """In the sandbox the orphan comes back to the training process; without it, to the supervisor
    (a subreaper), whose clock counts what came to it too. Slow tier: the orphan trains to the cap
    on the supervisor's real clock."""
    if sandboxed and not sandbox.available()[0]:
        pytest.skip(f"no sandbox here: {sandbox.available()[1]}")
    job = JobSpec(run_id=1, asset=DETACHED, profile="smoke", seed=0)
    result = run_job(job, tmp_path / "run", threads=THREADS, use_sandbox=sandboxed)
    assert result.sandboxed == sandboxed
    assert_stopped_at_the_cap(result, short_budget)


@pytest.mark.slow
def test_sleeping_costs_no_cpu_budget_and_meets_the_hard_limit(
    smoke_prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow tier: the run must sleep until the wall-clock hard limit, 6 s after its start."""
    smoke = profiles.PROFILES["smoke"]
    monkeypatch.setitem(profiles.PROFILES, "smoke", dataclasses.replace(smoke, max_total_s=6.0))
    result = run(tmp_path, SESSION + MODEL + "time.sleep(600)\nh.finish(model)\n")
    assert result.status == "timeout" and "hard limit" in result.error
    assert result.metrics["training_seconds"] < smoke.cap_s(THREADS)  # asleep, it spent next to nothing
    assert result.timings.training_wall >= 6.0  # ended by the hard limit on wall time, not before it


@pytest.mark.slow
def test_the_honest_train_py_ends_inside_its_cap(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: the repository's train.py trains its whole budget (3 s on the CPU clock, about
    10 s of a run) and the export: what is under test is that all of it fits the cap."""
    smoke = profiles.get_profile("smoke")
    result = run(tmp_path, (REPO / "train.py").read_text())
    assert result.status == "ok", result.error
    assert result.metrics["training_seconds"] < smoke.cap_s(THREADS)
    # It trained for about the budget after its start-up: at least half of it, even on a busy machine.
    assert result.metrics["claimed_training_seconds"] > smoke.time_budget_s / 2
