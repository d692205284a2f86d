"""Several agent questions open at once: as many as the free and soon-free slots need (the lookahead
paced by the agent's answers and the runs' length), within the open-question limit and the agent's
budget, each with its own context; what is proposed at once is
distinct; a question that times out stalls none of the others; a conductor killed with questions
open resumes from the store. The agents are gated by the test (each answer waits until the test
releases it), so every state is reached by events, never by waiting on a clock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes import IDENTITY, SMALL_TRAIN_PY, FakeRunner, with_effect

from bot.agent.explorer import OfflineExplorer
from bot.core.records import Proposal, ProposalContext, code_hash
from bot.core.states import State
from bot.forge.memory import MemoryForge
from bot.loop import proposals as proposals_module
from bot.loop.agent_worker import AgentWorker
from bot.loop.conductor import Conductor, ConductorConfig
from bot.loop.proposals import ANSWERS_PER_TICK, paced_lookahead
from bot.store import Store

MAIN = with_effect(SMALL_TRAIN_PY, 0.0, "main")
PROGRAM = "---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n---\n\nLower val_bpb.\n"
WAIT_S = 10.0  # how long a test waits for the agent's threads to reach a state before failing


class Gated:
    """Answers each question with `answer(ctx, n)` (n: the question's number, from 1, in the order the
    conductor asked them, which its thread's name carries: the order the threads reach the agent is
    the scheduler's) once the test has released n; counts the questions thinking at once."""

    def __init__(self, answer: Callable[[ProposalContext, int], Proposal]) -> None:
        self.answer = answer
        self.cond = threading.Condition()
        self.asked: dict[int, ProposalContext] = {}
        self.released: set[int] = set()
        self.thinking = 0
        self.most = 0

    @property
    def contexts(self) -> list[ProposalContext]:
        """The questions' contexts in the order they were asked."""
        with self.cond:
            return [self.asked[n] for n in sorted(self.asked)]

    def propose(self, ctx: ProposalContext) -> Proposal:
        number = int(threading.current_thread().name.rsplit("-", 1)[1])  # agent-<experiment>-<question>
        with self.cond:
            self.asked[number] = ctx
            self.thinking += 1
            self.most = max(self.most, self.thinking)
            self.cond.notify_all()
            self.cond.wait_for(lambda: number in self.released, timeout=60)
            self.thinking -= 1
            self.cond.notify_all()
        return self.answer(ctx, number)

    def release(self, *numbers: int) -> None:
        with self.cond:
            self.released.update(numbers)
            self.cond.notify_all()

    def release_all(self) -> None:
        self.release(*range(1, 1000))

    def wait_asked(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.asked) >= n, timeout=WAIT_S), f"{n} questions never came"


def distinct(ctx: ProposalContext, n: int) -> Proposal:
    return Proposal(f"change {n}", "h", with_effect(ctx.asset, 0.1, f"change {n}"))


def make(store: Store, forge: MemoryForge, agent, slots: int, **config) -> tuple[Conductor, threading.Event]:
    loop = Conductor(
        store,
        forge,
        FakeRunner(slots, auto=False),
        agent,
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), retry_base_s=0.0, **config),
    )
    woken = threading.Event()
    loop.wake_on(woken.set)
    return loop, woken


def fresh(agent, slots: int, **config) -> tuple[Conductor, threading.Event]:
    forge = MemoryForge({"train.py": MAIN, "program.md": PROGRAM})
    return make(Store(Path(":memory:")), forge, agent, slots, **config)


def tick_until(loop: Conductor, woken: threading.Event, done: Callable[[], bool]) -> None:
    """Tick as the driver does, once the conductor is woken (an answer came), until `done()`."""
    for _ in range(200):
        woken.clear()
        loop.tick()
        errors = [e["message"] for e in loop.store.events.all() if e["kind"] == "error"]
        assert not errors, errors
        if done():
            return
        assert woken.wait(WAIT_S), "the conductor was never woken"
    raise AssertionError("the condition was never reached")


def proposing(loop: Conductor) -> list[int]:
    return [e.id for e in loop.store.experiments.in_state(State.PROPOSING)]


def proposed(loop: Conductor) -> list[str]:
    return [e.title for e in loop.store.experiments.all()]


def test_free_slots_get_as_many_questions_at_once_each_with_its_own_context() -> None:
    agent = Gated(distinct)
    loop, woken = fresh(agent, slots=4)
    loop.tick()  # main's 2 baseline runs take 2 slots; 4 slots and 4 ahead less those: 6 wanted, 4 open
    agent.wait_asked(4)
    assert len(proposing(loop)) == 4 and agent.thinking == 4
    assert len({id(c) for c in agent.contexts}) == 4
    agent.release(1, 2, 3, 4)
    tick_until(loop, woken, lambda: len(proposed(loop)) == 4)
    assert proposed(loop) == ["change 1", "change 2", "change 3", "change 4"]
    agent.release_all()


def test_one_slot_asks_one_question_at_a_time_as_before() -> None:
    agent = Gated(distinct)
    loop, woken = fresh(agent, slots=1, lookahead=3)
    loop.tick()
    agent.wait_asked(1)
    for _ in range(3):
        loop.tick()
    assert len(agent.contexts) == 1  # two proposals are wanted (main's 2 runs wait), but one question at a time
    agent.release(1, 2)
    tick_until(loop, woken, lambda: len(proposed(loop)) == 2)
    assert agent.most == 1


def test_an_agent_that_takes_one_question_at_a_time_is_asked_one_at_a_time() -> None:
    class InOrder(Gated):
        questions_at_once = 1

    agent = InOrder(distinct)
    loop, woken = fresh(agent, slots=4)
    loop.tick()
    agent.wait_asked(1)
    for _ in range(3):
        loop.tick()
    assert len(agent.contexts) == 1 and len(proposing(loop)) == 1
    agent.release(1, 2)
    tick_until(loop, woken, lambda: len(proposed(loop)) == 2)
    assert agent.most == 1


def test_the_open_question_limit_holds() -> None:
    agent = Gated(distinct)
    loop, woken = fresh(agent, slots=4, max_open_questions=2)
    loop.tick()
    agent.wait_asked(2)
    for _ in range(3):
        loop.tick()
    assert len(proposing(loop)) == 2 and len(agent.contexts) == 2
    agent.release(1)
    tick_until(loop, woken, lambda: len(proposed(loop)) == 1)
    agent.wait_asked(3)  # the answer made room for one more
    assert agent.most == 2 and len(proposing(loop)) == 2
    agent.release_all()


def test_the_explorer_gives_questions_open_at_once_distinct_moves() -> None:
    explorer = OfflineExplorer()
    agent = Gated(lambda ctx, n: explorer.propose(ctx))
    loop, woken = fresh(agent, slots=4)
    loop.tick()
    agent.wait_asked(4)  # all four asked before any answer: the same history in every context
    assert len({len(c.history) for c in agent.contexts}) == 1
    agent.release_all()
    tick_until(loop, woken, lambda: len(proposed(loop)) >= 4)
    codes = [e.code_hash for e in loop.store.experiments.all()]
    assert len(set(codes)) == len(codes)
    assert not [e for e in loop.store.events.all() if e["kind"] == "refused"]


class IdeaAgent:
    """A fake LLM: takes the first idea that is neither in the history nor in a diff being tried,
    and writes it in its own words (a comment naming its session), so only the repeat check up to
    comments can tell two sessions' texts of one idea apart."""

    IDEAS = ("warmup", "depth", "lr", "width")

    def pick(self, ctx: ProposalContext, n: int) -> Proposal:
        taken = {e.title for e in ctx.history} | {i for i in self.IDEAS for d in ctx.in_flight.values() if i in d}
        idea = next(i for i in self.IDEAS if i not in taken)
        text = with_effect(ctx.asset, 0.1, idea) + f"# written by session {n}\n"
        return Proposal(idea, f"try {idea}", text)


def test_a_question_told_of_the_proposals_in_flight_proposes_something_different() -> None:
    agent = Gated(IdeaAgent().pick)
    loop, woken = fresh(agent, slots=4, max_open_questions=1)
    agent.release_all()
    tick_until(loop, woken, lambda: len(proposed(loop)) == 2)
    first, second = agent.contexts[:2]
    assert first.in_flight == {}
    assert list(second.in_flight) == [1] and '"warmup"' in second.in_flight[1]
    assert proposed(loop) == ["warmup", "depth"]


def test_a_repeat_crossing_another_answer_is_refused_without_counting_toward_max_refusals() -> None:
    agent = Gated(IdeaAgent().pick)
    loop, woken = fresh(agent, slots=2, max_open_questions=2, max_refusals=1)
    loop.tick()
    agent.wait_asked(2)  # both open at once: neither can know what the other proposes
    agent.release(1)
    tick_until(loop, woken, lambda: proposed(loop) == ["warmup"])
    agent.release(2, 3)
    tick_until(loop, woken, lambda: len(proposed(loop)) == 2)
    assert proposed(loop) == ["warmup", "depth"] and not loop.proposals.stopped
    refused = [e["message"] for e in loop.store.events.all() if e["kind"] == "refused"]
    assert len(refused) == 1 and "repeats experiment 1 ('warmup') up to comments" in refused[0]
    assert any("proposed while you worked on yours" in line for line in agent.contexts[2].feedback)
    agent.release_all()


def test_questions_in_flight_count_against_the_budget_so_it_is_overshot_by_less_than_one_answer() -> None:
    def priced(ctx: ProposalContext, n: int) -> Proposal:
        return Proposal(f"change {n}", "h", with_effect(ctx.asset, 0.1, f"change {n}"), meta={"cost_usd": 0.40})

    agent = Gated(priced)
    loop, woken = fresh(agent, slots=4, agent_budget_usd=1.0)
    loop.tick()
    agent.wait_asked(1)
    loop.tick()
    assert len(agent.contexts) == 1  # what one answer costs is not known yet: one at a time
    agent.release(1)
    tick_until(loop, woken, lambda: len(proposed(loop)) == 1)  # the tick that takes it asks again
    agent.wait_asked(3)  # $0.40 spent, one more in flight: $1.20 > $1
    for _ in range(3):
        loop.tick()
    assert len(agent.contexts) == 3 and agent.most == 2
    agent.release(2, 3)
    tick_until(loop, woken, lambda: bool(loop.proposals.stopped))
    assert loop.proposals.spent_usd() < 1.0 + 0.40
    assert "budget of $1.00 is spent ($1.20 so far)" in loop.proposals.stopped
    assert len(agent.contexts) == 3 and proposed(loop) == ["change 1", "change 2", "change 3"]


def test_a_question_that_times_out_does_not_stall_the_others() -> None:
    now = [1000.0]
    agent = Gated(distinct)
    forge = MemoryForge({"train.py": MAIN, "program.md": PROGRAM})
    loop = Conductor(
        Store(Path(":memory:")),
        forge,
        FakeRunner(3, auto=False),
        agent,
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), retry_base_s=0.0, agent_timeout_s=10.0),
        clock=lambda: now[0],
    )
    woken = threading.Event()
    loop.wake_on(woken.set)
    loop.tick()
    agent.wait_asked(3)
    agent.release(*range(2, 100))  # every question but the first to reach the agent answers
    tick_until(loop, woken, lambda: len(proposing(loop)) == 1)
    # the experiment whose question hangs: the threads' order, not the experiments', numbers the questions
    [hung] = proposing(loop)
    assert len(proposed(loop)) >= 2  # the others were answered while it hung
    now[0] += 11.0  # question 1 is past its time limit: abandoned, its experiment asked again
    loop.tick()  # the driver's timer: the tick that finds it abandoned
    tick_until(loop, woken, lambda: hung not in proposing(loop))
    assert any("no proposal after 10s" in e["message"] for e in loop.store.events.all())
    assert agent.thinking == 1  # question 1 still hangs; its late answer will be ignored
    agent.release_all()


def test_an_abandoned_question_s_late_answer_is_ignored_but_paid_for() -> None:
    """A paid agent bills an answer that came after its question's time limit: it is no proposal,
    but what it cost is spent, and an event says so."""
    now = [1000.0]

    def priced(ctx: ProposalContext, n: int) -> Proposal:
        return Proposal(f"change {n}", "h", with_effect(ctx.asset, 0.1, f"change {n}"), meta={"cost_usd": 0.25})

    agent = Gated(priced)
    forge = MemoryForge({"train.py": MAIN, "program.md": PROGRAM})
    config = ConductorConfig(
        profile="smoke", identity=dict(IDENTITY), retry_base_s=0.0, agent_timeout_s=10.0, max_open_questions=1
    )
    loop = Conductor(Store(Path(":memory:")), forge, FakeRunner(3, auto=False), agent, config, clock=lambda: now[0])
    woken = threading.Event()
    loop.wake_on(woken.set)
    loop.tick()
    agent.wait_asked(1)
    now[0] += 11.0  # past the time limit: abandoned
    loop.tick()
    assert any("no proposal after 10s" in e["message"] for e in loop.store.events.all())
    assert loop.proposals.spent_usd() == 0.0
    woken.clear()
    agent.release(1)  # the abandoned question answers now: too late to be a proposal
    assert woken.wait(WAIT_S)
    tick_until(loop, woken, lambda: loop.proposals.spent_usd() == 0.25)
    [late] = [e for e in loop.store.events.all() if e["kind"] == "late"]
    assert "proposal 'change 1'" in late["message"] and "$0.2500 spent" in late["message"]
    agent.wait_asked(2)  # the experiment was asked again
    agent.release(2)
    tick_until(loop, woken, lambda: bool(proposed(loop)))
    assert proposed(loop)[0] == "change 2" and "change 1" not in proposed(loop)
    assert loop.proposals.spent_usd() == 0.25 * (1 + len(proposed(loop)))
    agent.release_all()


def test_an_answer_counts_against_the_budget_until_it_is_paid_for() -> None:
    """AgentWorker.unpaid: a question thinking, an answer not yet taken, an abandoned question still
    thinking and its late answer not yet paid for each count; an answer taken or paid for does not."""
    now = [0.0]
    agent = Gated(distinct)
    worker = AgentWorker(agent, timeout_s=10.0, clock=lambda: now[0])
    answered = threading.Event()
    worker.on_answer(answered.set)
    context = ProposalContext(program_md="", asset=MAIN, history=[], main_val_bpb=1.0)
    assert worker.ask(1, context, limit=2) and worker.ask(2, context, limit=2)
    agent.wait_asked(2)
    assert worker.unpaid() == 2
    agent.release(1)
    assert answered.wait(WAIT_S) and worker.answered(1)
    assert worker.unpaid() == 2  # answered, not yet taken: its cost is not spent yet
    assert isinstance(worker.answer(1), Proposal) and worker.unpaid() == 1
    now[0] += 11.0
    assert isinstance(worker.answer(2), TimeoutError) and worker.unpaid() == 1  # abandoned, still thinking
    answered.clear()
    agent.release(2)
    assert answered.wait(WAIT_S)
    assert worker.unpaid() == 1  # its late answer, not yet paid for
    assert [a.title for a in worker.late_answers()] == ["change 2"] and worker.unpaid() == 0


def test_every_answer_not_yet_paid_for_counts_against_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget rule reads AgentWorker.unpaid (questions thinking, answers not yet taken, late
    answers), each at the highest cost of one answer so far."""
    loop, _ = fresh(Gated(distinct), slots=4, agent_budget_usd=1.0)
    proposals = loop.proposals
    proposals._answers_costed, proposals._most_usd = 1, 0.40
    monkeypatch.setattr(proposals.worker, "running", lambda: 0)  # none thinking: only the unpaid count says
    monkeypatch.setattr(proposals.worker, "unpaid", lambda: 2)
    assert proposals._affordable()  # $0.80 may still be billed: one more fits under $1
    monkeypatch.setattr(proposals.worker, "unpaid", lambda: 3)
    assert not proposals._affordable()  # $1.20


def test_a_conductor_killed_with_questions_open_resumes_them_without_loss_or_repeat(tmp_path: Path) -> None:
    forge = MemoryForge({"train.py": MAIN, "program.md": PROGRAM})
    first = Gated(distinct)
    killed, _ = make(Store(tmp_path / "state.db"), forge, first, slots=3)
    killed.tick()
    first.wait_asked(3)
    open_ids = proposing(killed)
    assert len(open_ids) == 3
    # killed: its questions' answers never reach a store (the second conductor's agent differs)
    again = Gated(lambda ctx, n: Proposal(f"again {n}", "h", with_effect(ctx.asset, 0.1, f"again {n}")))
    resumed, woken = make(Store(tmp_path / "state.db"), forge, again, slots=3)
    resumed.tick()
    again.wait_asked(3)
    assert proposing(resumed) == open_ids and all(resumed.proposals.worker.busy(i) for i in open_ids)
    again.release(1, 2, 3)
    tick_until(resumed, woken, lambda: not set(open_ids) & set(proposing(resumed)))
    exps = [e for e in resumed.store.experiments.all() if e.id in open_ids]
    assert sorted(e.title for e in exps) == ["again 1", "again 2", "again 3"]
    assert len({e.code_hash for e in resumed.store.experiments.all()}) == len(resumed.store.experiments.all())
    assert code_hash(MAIN) not in {e.code_hash for e in exps}
    first.release_all()
    again.release_all()


def test_an_open_question_limit_below_one_is_refused_saying_what_to_set() -> None:
    with pytest.raises(ValueError, match="max_open_questions must be at least 1 .got 0., or None for one per slot"):
        fresh(Gated(distinct), slots=2, max_open_questions=0)


def test_an_answer_s_run_starts_before_the_next_answer_of_the_tick_makes_its_branch() -> None:
    agent = Gated(distinct)
    loop, woken = fresh(agent, slots=4)
    loop.tick()  # main's 2 runs take 2 slots; 4 questions open
    agent.wait_asked(4)
    runner, forge = loop.runner, loop.forge
    running_at_branch: list[int] = []
    create_branch = forge.create_branch

    def counting(*args, **kwargs):
        running_at_branch.append(len(runner.running()))
        return create_branch(*args, **kwargs)

    forge.create_branch = counting
    agent.release(1, 2, 3, 4)
    with agent.cond:
        assert agent.cond.wait_for(lambda: agent.thinking == 0, timeout=WAIT_S)
    tick_until(loop, woken, lambda: len(proposed(loop)) == 4)
    assert running_at_branch[:3] == [2, 3, 4]  # each answer's run took a free slot before the next branch
    agent.release_all()


def test_a_tick_takes_two_answers_and_wakes_the_driver_for_the_rest() -> None:
    agent = Gated(distinct)
    loop, woken = fresh(agent, slots=4)
    loop.tick()
    agent.wait_asked(4)
    agent.release(1, 2, 3, 4)
    worker = loop.proposals.worker
    while not all(worker.answered(i) for i in range(1, 5)):  # each answer wakes the conductor
        assert woken.wait(WAIT_S), "the answers never came"
        woken.clear()
    woken.clear()
    loop.tick()
    assert len(proposed(loop)) == ANSWERS_PER_TICK == 2
    assert woken.is_set()  # the driver ticks again at once for the answers left
    loop.tick()
    assert len(proposed(loop)) == 4
    agent.release_all()


# --- how many are prepared ahead: paced by the agent's answers and the runs' length -------------


@pytest.mark.parametrize(
    ("slots", "ready_s", "run_s", "ending", "lookahead"),
    [
        (16, None, 300.0, 0, 16),  # no proposal ready yet: one per slot, as before
        (16, 20.0, None, 0, 16),  # no run finished yet
        (16, 20.0, 1.5, 0, 16),  # runs of a second and a half (fakes): no pace, one per slot
        (16, 20.0, 300.0, 0, 1),  # none due to end before a proposal asked now is ready: one ahead
        (16, 20.0, 300.0, 5, 6),  # five due: one each, and one more
        (16, 20.0, 300.0, 16, 16),  # a burst of all of them: never more than one per slot
        (1, 20.0, 300.0, 1, 1),
    ],
)
def test_the_lookahead_is_one_more_than_the_runs_due_to_end_before_a_proposal_is_ready(
    slots: int, ready_s: float | None, run_s: float | None, ending: int, lookahead: int
) -> None:
    horizons: list[float] = []
    assert paced_lookahead(slots, ready_s, run_s, lambda h: horizons.append(h) or ending) == lookahead
    assert horizons in ([], [30.0])  # the time to be ready, counted half again


def test_runs_due_to_end_are_those_started_a_run_length_ago_less_the_horizon() -> None:
    store = Store(Path(":memory:"))
    now = time.time()
    for n, started_s_ago in enumerate((290.0, 250.0, 100.0, 5.0)):
        run = store.runs.add(
            experiment_id=None,
            purpose="baseline",
            code_hash=f"c{n}",
            commit_sha="c" * 40,
            base_sha="b" * 40,
            asset="",
            profile="smoke",
        )
        store.runs.mark_started(run.id, "x")
        store.db.execute("UPDATE runs SET started_at = ? WHERE id = ?", (now - started_s_ago, run.id))
    assert store.runs.ending_within(30.0, 300.0) == 1  # ends in 10 s
    assert store.runs.ending_within(60.0, 300.0) == 2  # ... and in 50 s
    assert store.runs.ending_within(300.0, 300.0) == 4
    # the next to come within 30 s of its end is the one started 250 s ago: in 20 s
    assert store.runs.next_ending_within(30.0, 300.0) == pytest.approx(20.0, abs=1.0)
    assert store.runs.next_ending_within(300.0, 300.0) is None  # all are there already


def test_a_rack_with_a_quick_agent_prepares_only_the_few_proposals_its_pace_needs() -> None:
    """16 slots, proposals ready 20 s after their question, runs of 300 s that all started just now:
    one ahead of the slots, not 16; every proposal waiting in the queue would wait a run's length,
    and a keep would move main under most of them. Once they are due to end, one for each."""
    agent = Gated(distinct)
    agent.release_all()
    loop, woken = fresh(agent, slots=16)
    loop.store.runs.recent_ready_s = lambda limit=32: 20.0  # type: ignore[method-assign]
    loop.store.runs.recent_length_s = lambda limit=32: 300.0  # type: ignore[method-assign]
    tick_until(loop, woken, lambda: not proposing(loop) and len(proposed(loop)) >= 14)
    loop.tick()
    assert len(loop.runner.running()) == 16  # main's 2 runs and 14 candidates
    assert len(proposed(loop)) == 14 + 1 and not proposing(loop)
    # nothing announces the moment the runs come within a proposal's time (20 s, counted half
    # again) of their end: the conductor names it, and the driver ticks then, not at its timer
    assert 300.0 - 30.0 - 5.0 < loop.next_due_s() <= 300.0 - 30.0
    loop.store.db.execute("UPDATE runs SET started_at = started_at - 290 WHERE state = 'running'")
    assert loop.next_due_s() is None  # all are due now: nothing more to wake for
    tick_until(loop, woken, lambda: not proposing(loop) and len(proposed(loop)) >= 14 + 16)
    loop.tick()
    assert len(proposed(loop)) == 14 + 16  # all 16 due: one ahead per slot, the most there is


def test_no_question_is_due_where_the_lookahead_is_set_or_the_agent_is_asked_nothing_more() -> None:
    agent = Gated(distinct)
    agent.release_all()
    for config, stop in (({"lookahead": 2}, False), ({}, True)):
        loop, woken = fresh(agent, slots=4, **config)
        loop.store.runs.recent_ready_s = lambda limit=32: 20.0  # type: ignore[method-assign]
        loop.store.runs.recent_length_s = lambda limit=32: 300.0  # type: ignore[method-assign]
        tick_until(loop, woken, lambda loop=loop: not proposing(loop) and len(proposed(loop)) >= 2)
        if stop:
            loop.proposals.stopped = "the agent has nothing more to propose"
        assert loop.runner.running() and loop.next_due_s() is None


def test_without_a_pace_yet_a_rack_prepares_one_proposal_per_slot() -> None:
    agent = Gated(distinct)
    agent.release_all()
    loop, woken = fresh(agent, slots=16)
    loop.store.runs.recent_length_s = lambda limit=32: None  # type: ignore[method-assign]
    tick_until(loop, woken, lambda: not proposing(loop) and len(proposed(loop)) >= 14)
    loop.tick()
    assert len(proposed(loop)) == 14 + 16 and not proposing(loop)


# --- an answer to a question asked on a main that moved meanwhile --------------------------------


def four_asked(**config) -> tuple[Gated, Conductor, threading.Event]:
    """Four slots, main's 2 runs queued and 4 questions open on main as it is."""
    agent = Gated(distinct)
    loop, woken = fresh(agent, slots=4, **config)
    loop.tick()
    agent.wait_asked(4)
    return agent, loop, woken


def move_main(loop: Conductor, asset: str) -> str:
    """A commit to main's train.py while the agent thinks (a keep, or a person's push)."""
    forge = loop.forge
    forge.create_branch("people/edit", forge.main_sha(), {"train.py": asset}, "an edit of main")
    return forge.merge("people/edit", forge.main_sha(), "an edit of main")


def test_an_answer_asked_on_a_main_that_moved_is_branched_once_on_main_as_it_is_now() -> None:
    agent = Gated(distinct)
    loop, woken = fresh(agent, slots=4)
    loop.tick()  # main's 2 runs and 4 questions
    agent.wait_asked(4)
    asked_on = loop.forge.main_sha()
    moved_to = move_main(loop, MAIN.replace("import math\n", "import math\n_people = 1\n", 1))
    rebases: list[str] = []
    rebase = loop.forge.rebase_branch
    loop.forge.rebase_branch = lambda *a, **k: rebases.append(a[0]) or rebase(*a, **k)  # type: ignore[method-assign]
    agent.release(1)
    tick_until(loop, woken, lambda: 1 not in proposing(loop))

    exp = loop.store.experiments.get(1)
    assert asked_on != moved_to and exp.base_sha == moved_to
    assert "_people = 1" in exp.asset and '_fake_effect = (0.1, "change 1")' in exp.asset  # both changes
    assert loop.forge.parent(exp.head_sha) == moved_to and loop.forge.read_file(exp.head_sha, "train.py") == exp.asset
    assert rebases == []  # made once, on the main it runs on
    [moved] = [e["message"] for e in loop.store.events.all() if e["kind"] == "moved"]
    assert moved.startswith(f"proposed on main {asked_on[:7]}, which moved")
    assert [r.base_sha for r in loop.store.runs.all(experiment_id=1)] == [moved_to]
    agent.release_all()


def test_an_answer_that_overlaps_what_changed_on_main_meanwhile_ends_as_a_conflict_on_record() -> None:
    agent, loop, woken = four_asked()
    asked_on = loop.forge.main_sha()
    move_main(loop, with_effect(MAIN, -0.2, "people"))  # the line the answer changes too
    agent.release(1)
    tick_until(loop, woken, lambda: loop.store.experiments.get(1).state == "done")

    exp = loop.store.experiments.get(1)
    assert exp.title == "change 1" and exp.status == "discard" and "conflicts with main" in exp.reason
    assert loop.forge.parent(exp.head_sha) == asked_on  # branched where it was asked, as it came
    assert not [e for e in loop.store.events.all() if e["kind"] == "refused"]
    agent.release_all()


def test_an_answer_main_took_meanwhile_is_refused_as_proposed_meanwhile_without_counting() -> None:
    agent, loop, woken = four_asked(max_refusals=1)
    move_main(loop, with_effect(MAIN, 0.1, "change 1"))  # exactly what the first answer will be
    agent.release(1)
    tick_until(loop, woken, lambda: any(e["kind"] == "refused" for e in loop.store.events.all()))
    agent.wait_asked(5)

    [refused] = [e["message"] for e in loop.store.events.all() if e["kind"] == "refused"]
    assert "identical to main" in refused
    assert not loop.proposals.stopped  # one refusal allowed, and this one is not counted
    assert any("proposed while you worked on yours" in note for note in agent.contexts[4].feedback)
    agent.release_all()


def test_an_answer_the_merge_cannot_carry_stays_on_the_main_it_was_asked_on(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise OSError("git merge-file: no space left on device")

    monkeypatch.setattr(proposals_module, "merge_text", broken)
    agent, loop, woken = four_asked()
    asked_on = loop.forge.main_sha()
    move_main(loop, MAIN.replace("import math\n", "import math\n_people = 1\n", 1))
    bases: list[str] = []
    create_branch = loop.forge.create_branch
    loop.forge.create_branch = lambda b, base, *a: bases.append(base) or create_branch(b, base, *a)  # type: ignore[method-assign]
    agent.release(1)
    tick_until(loop, woken, lambda: 1 not in proposing(loop))

    assert loop.store.experiments.get(1).title == "change 1"
    assert bases == [asked_on]  # branched where it was asked, as before (and rebased after)
    assert not [e for e in loop.store.events.all() if e["kind"] == "moved"]
    agent.release_all()
