"""The work clock of a CPU profile: each step after the warm-up ones is charged the operations it was
counted doing, so that two runs of one train.py train the same steps whatever the machine's load,
while the CPU-time clock stays the hard limit and can only end training earlier."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode

from runner.harness import Session
from runner.profiles import PROFILES, get_profile
from runner.work import FlopCount

MATMUL = 2 * 64**3  # the operations of one [64, 64] @ [64, 64]
# on 2 threads a cap of 5 s, and the CPU clock ends training by 4.5 s; the work clock charges a matmul 0.5 s
WORK = replace(
    get_profile("smoke"),
    name="work",
    time_budget_s=3.0,
    allowance_s=4.0,
    export_margin_s=1.0,
    flops_per_second=MATMUL / 0.5,
)


class HandClock:
    """A clock that moves only when the test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def open_session(prepared, tmp_path) -> tuple[Session, HandClock]:
    cpu = HandClock(start=50.0)
    session = Session(
        WORK,
        prepared.dataset,
        prepared.tokenizer,
        out_dir=tmp_path,
        device=torch.device("cpu"),
        threads=2,
        wall_clock=HandClock(),
        cpu_clock=cpu,
    )
    return session, cpu


def matmul_step(session: Session, cpu: HandClock, cpu_s: float) -> None:
    """One step that does one counted matmul and takes `cpu_s` of CPU time."""
    torch.ones(64, 64) @ torch.ones(64, 64)
    cpu.now += cpu_s
    session.step_done(2.0)


def steps_until_time_up(session: Session, cpu: HandClock, cpu_s: float) -> int:
    steps = 0
    while not session.time_up():
        matmul_step(session, cpu, cpu_s)
        steps += 1
    session.stop_counting()
    return steps


def test_the_count_is_a_matmuls_and_attentions_operations_forward_and_backward():
    a = torch.ones(64, 64, requires_grad=True)
    with FlopCount() as count:
        (a @ a).sum().backward()
    assert count.flops == 3 * MATMUL  # the product, then one product for each side's gradient

    q = torch.ones(2, 4, 32, 16, requires_grad=True)
    with FlopCount() as count:
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    scores_and_values = 2 * (2 * 2 * 4 * 32 * 32 * 16)  # q @ k^T and p @ v
    assert count.flops == scores_and_values * 7 // 2  # forward, and backward's 2.5 times as much


def test_runs_train_the_same_steps_whatever_their_cpu_time_per_step(smoke_prepared, tmp_path):
    trained = []
    for name, cpu_s in (("quiet", 0.4), ("busy", 0.9)):  # 0.2 s and 0.45 s of the run's clock
        session, cpu = open_session(smoke_prepared, tmp_path / name)
        assert steps_until_time_up(session, cpu, cpu_s) == session.step
        trained.append((session.step, session.work_seconds))
    # The warm-up step, then five charged 0.5 s each: a sixth would take the charges past the 3 s budget.
    assert trained == [(6, pytest.approx(2.5)), (6, pytest.approx(2.5))]


def test_the_cpu_clock_still_ends_training_when_the_machine_is_slower_than_the_charges(smoke_prepared, tmp_path):
    session, cpu = open_session(smoke_prepared, tmp_path)
    steps_until_time_up(session, cpu, cpu_s=2.0)  # 1 s of the run's clock a step, charged 0.5
    assert session.step == 4 and session.work_seconds == pytest.approx(1.5)
    assert session.elapsed() + 1.0 >= WORK.training_ends_s(2) == 4.5


def test_progress_follows_the_charges_and_reaches_one_as_training_ends(smoke_prepared, tmp_path):
    session, cpu = open_session(smoke_prepared, tmp_path)
    matmul_step(session, cpu, cpu_s=0.2)  # warm-up
    seen = []
    while not session.time_up():
        matmul_step(session, cpu, cpu_s=0.2)
        seen.append(session.progress())
    session.stop_counting()
    # the window is the budget less the next step's charge: 2.5 s, reached after the fifth timed step
    assert seen == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_leaving_the_count_trains_on_to_the_cpu_clocks_end(smoke_prepared, tmp_path):
    session, cpu = open_session(smoke_prepared, tmp_path)
    matmul_step(session, cpu, cpu_s=0.4)
    assert isinstance(_pop_mode(), FlopCount)  # what a train.py that wants more steps could do
    steps = steps_until_time_up(session, cpu, cpu_s=0.4)
    assert session.work_seconds == 0.0
    assert 1 + steps == session.step == 22  # the CPU clock's end: 0.2 s a step, the next past 4.5 s
    assert session.elapsed() <= WORK.training_ends_s(2)


def test_stop_counting_leaves_no_mode_behind(smoke_prepared, tmp_path):
    session, _ = open_session(smoke_prepared, tmp_path)
    assert isinstance(_get_current_dispatch_mode(), FlopCount)
    session.stop_counting()
    session.stop_counting()
    assert _get_current_dispatch_mode() is None


def test_no_shipped_profile_has_a_work_clock_while_train_py_can_leave_the_count():
    """An honest run stops at the charges, one that leaves the count at the CPU clock's later end
    (the test above): a shipped work clock would sell train.py steps that main does not get."""
    assert all(profile.flops_per_second == 0 for profile in PROFILES.values())
    with pytest.raises(ValueError, match="cpu clock only"):
        replace(PROFILES["h100"], flops_per_second=1e12)


class TinyLM(torch.nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, 8)
        self.head = torch.nn.Linear(8, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(idx))


def test_finish_leaves_the_count_before_the_export_and_records_the_charges(smoke_prepared, tmp_path):
    session, cpu = open_session(smoke_prepared, tmp_path)
    session.export = True
    for _ in range(3):
        matmul_step(session, cpu, cpu_s=0.4)
    result = session.finish(TinyLM(session.vocab_size))
    assert _get_current_dispatch_mode() is None
    assert (tmp_path / "model.pt2").exists()
    claims = json.loads((tmp_path / "claims.json").read_text())
    assert (
        claims["extra"]
        == result.extra
        == {
            "work_seconds": 1.0,
            "flops_per_step": pytest.approx(MATMUL),
            "ended_by_work": False,  # it stopped on its own, the charges far from the budget
        }
    )


@pytest.mark.parametrize(("cpu_s", "by_work"), [(0.4, True), (2.0, False)])
def test_the_claims_say_whether_the_charges_ended_training(smoke_prepared, tmp_path, cpu_s, by_work):
    """The conductor runs a slowed run again only where the CPU clock, not the charges, ended it."""
    session, cpu = open_session(smoke_prepared, tmp_path)
    while not session.time_up():
        matmul_step(session, cpu, cpu_s)
    assert session.finish(TinyLM(session.vocab_size)).extra["ended_by_work"] is by_work
