"""What the agent is told: the context kept in memory and brought up to date with what changed is
the context read whole from the store, over a loop with keeps, discards, crashes, a fix, a refused
repeat and people's feedback; and bringing it up to date reads only what changed."""

from __future__ import annotations

import threading
from pathlib import Path

from fakes import CRASH_MARK, IDENTITY, SMALL_TRAIN_PY, FakeRunner, with_effect

from bot.core.records import HistoryEntry, Proposal, ProposalContext
from bot.core.states import State, Status
from bot.forge.memory import MemoryForge
from bot.loop import measurement
from bot.loop.baseline import Main
from bot.loop.conductor import Conductor, ConductorConfig
from bot.loop.proposals import Proposals, _diff
from bot.store import Experiment, Store

MAIN = with_effect(SMALL_TRAIN_PY, 0.0, "main")
PROGRAM = "---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n---\n\nLower val_bpb.\n"

# (what the change does, its tag): a keep, a discard, a crash, its fix, a repeat of the discard
# (refused, so the agent is asked again with the reason), then more of each
PLAN = [
    ("gain", "a"),
    ("loss", "b"),
    ("crash", "c"),
    ("fix", "c"),
    ("loss", "b"),
    ("loss", "d"),
    ("gain", "e"),
    ("crash", "f"),
    ("loss", "g"),
    ("fix", "f"),
    ("gain", "h"),
]


class PlannedAgent:
    """Proposes PLAN in order on whatever main it is shown, a repeat included (the conductor refuses
    it); a fix names the crash the context reports."""

    def __init__(self) -> None:
        self.plan = list(PLAN)

    def propose(self, ctx: ProposalContext) -> Proposal:
        kind, tag = self.plan.pop(0)
        if kind == "crash":
            return Proposal(f"crash {tag}", "it crashes", with_effect(ctx.asset, 0.0, tag) + CRASH_MARK)
        if kind == "fix":
            return Proposal(
                f"fix {tag}", "the crash fixed", with_effect(ctx.asset, 0.05, tag), {"fixes": ctx.last_crash_id}
            )
        effect = -0.1 if kind == "gain" else 0.1
        return Proposal(f"{kind} {tag}", f"a clear {kind}", with_effect(ctx.asset, effect, tag))


def context_read_whole(proposals: Proposals, main: Main, exp_id: int | None = None) -> ProposalContext:
    """The context of a question about `exp_id` as Proposals built it before it kept the history in
    memory: every experiment and every code hash read from the store at each question."""
    store = proposals.store
    done = store.experiments.all()
    history = [
        HistoryEntry(
            id=e.id,
            title=e.title,
            hypothesis=e.hypothesis,
            status=e.status or "running",
            val_bpb=e.val_bpb,
            delta=e.delta,
            code_hash=e.code_hash or "",
            meta=e.meta,
            error_tail=e.error_tail,
            margin=e.margin,
            lesson=_lesson(e.reason),
        )
        for e in done
    ]
    crash = _unfixed_crash(done)
    pending = proposals._pending.get(exp_id) if exp_id is not None else None
    notes, seen = (pending.notes, pending.seen) if pending else ([], set())
    hashes = {r[0] for r in store.db.execute("SELECT code_hash FROM experiments WHERE code_hash IS NOT NULL")}
    hashes |= {r[0] for r in store.db.execute("SELECT DISTINCT code_hash FROM runs")}
    return ProposalContext(
        program_md=main.instructions,
        asset=main.asset,
        main_sha=main.sha,
        main_val_bpb=measurement.main_value(proposals.baseline.values(), main.code_hash),
        history=history,
        feedback=store.feedback.recent() + notes,
        last_crash=crash.error_tail if crash else None,
        last_crash_id=crash.id if crash else None,
        seen_hashes=hashes | seen | {main.code_hash},
        profile=proposals.profile.name,
        device_kind=proposals.profile.device,
        spent_usd=proposals.spent_usd(),
        in_flight={e.id: _diff(main.asset, e.asset) if e.base_sha == main.sha else "" for e in done if not e.status},
    )


def _unfixed_crash(done: list[Experiment]) -> Experiment | None:
    finished = [e for e in done if e.state == State.DONE]
    if not finished or finished[-1].status != Status.CRASH:
        return None
    crash = finished[-1]
    return None if any(e.meta.get("fixes") == crash.id for e in done) else crash


def _lesson(reason: str | None, limit: int = 160) -> str:
    line = (reason or "").strip().splitlines()[0] if (reason or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def make(slots: int) -> Conductor:
    """A loop over PLAN, one question at a time: the plan's order (a fix after its crash, a repeat
    after what it repeats) is the order of the answers."""
    return Conductor(
        Store(Path(":memory:")),
        MemoryForge({"train.py": MAIN, "program.md": PROGRAM}),
        FakeRunner(slots),
        PlannedAgent(),
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=len(PLAN) - 1, max_open_questions=1),
    )


def test_the_context_kept_in_memory_is_the_context_read_whole() -> None:
    loop = make(slots=2)
    asked: list[ProposalContext] = []
    ask = loop.proposals.worker.ask

    def compare_then_ask(exp_id: int, context: ProposalContext, *, limit: int) -> bool:
        assert context == context_read_whole(loop.proposals, loop.baseline.read(), exp_id)
        asked.append(context)
        return ask(exp_id, context, limit=limit)

    loop.proposals.worker.ask = compare_then_ask
    woken = threading.Event()
    loop.wake_on(woken.set)
    for tick in range(400):
        woken.clear()
        loop.tick()
        if tick in (3, 20):
            loop.store.feedback.add("alice", f"try a deeper model (tick {tick})")
        if loop.finished():
            break
        proposing = loop.store.experiments.in_state(State.PROPOSING)
        if proposing and loop.proposals.worker.busy(proposing[0].id):
            woken.wait(timeout=10)  # the agent answers on its own thread: tick again once it has
    else:
        raise AssertionError("the loop never finished")
    statuses = [e.status for e in loop.store.experiments.all()]
    assert {Status.KEEP, Status.DISCARD, Status.CRASH} <= set(statuses)
    assert any(c.last_crash_id for c in asked) and any(c.feedback for c in asked)
    assert any(n.startswith("(conductor) your proposal 'loss b' was refused") for c in asked for n in c.feedback)
    assert len(asked[-1].history) == len(PLAN) - 2  # the refused repeat is no experiment


def test_bringing_the_context_up_to_date_reads_only_the_experiments_written_since() -> None:
    loop = make(slots=1)
    store, proposals, main = loop.store, loop.proposals, loop.baseline.read()
    for title in ("one", "two", "three"):
        exp = store.experiments.start_proposing(main.sha)
        store.experiments.fill_proposal(
            exp.id,
            title=title,
            hypothesis="h",
            slug=title,
            code_hash=title,
            asset=with_effect(MAIN, 0.1, title),
            meta={},
        )
    proposals.context(main)
    read: list[set[int]] = []
    several = store.experiments.several

    def counting(ids: set[int]) -> list[Experiment]:
        read.append(set(ids))
        return several(ids)

    store.experiments.several = counting
    store.experiments.update(2, reason="discarded: worse than main")
    context = proposals.context(main)
    assert read == [{2}]
    assert [e.lesson for e in context.history] == ["", "discarded: worse than main", ""]
    assert context == context_read_whole(proposals, main)


def test_what_a_rolled_back_transaction_wrote_is_not_kept() -> None:
    loop = make(slots=1)
    store, proposals, main = loop.store, loop.proposals, loop.baseline.read()
    exp = store.experiments.start_proposing(main.sha)
    store.experiments.fill_proposal(
        exp.id, title="one", hypothesis="h", slug="one", code_hash="one", asset=with_effect(MAIN, 0.1, "one"), meta={}
    )
    proposals.context(main)
    try:
        with store.transaction():
            store.experiments.update(exp.id, title="renamed, then rolled back")
            assert proposals.context(main).history[0].title == "renamed, then rolled back"
            raise RuntimeError("the transaction fails")
    except RuntimeError:
        pass
    assert proposals.context(main).history[0].title == "one"
    assert proposals.context(main) == context_read_whole(proposals, main)
