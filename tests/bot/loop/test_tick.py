"""What one tick costs and shows: main read once (again only after the tick's own merge), a live
summary that reads no git, and the publishers, results.tsv among them, shown the tick's end."""

from __future__ import annotations

import threading
from pathlib import Path

from fakes import IDENTITY, SMALL_TRAIN_PY, FakeRunner, with_effect

from bot.agent.scripted import ScriptedAgent
from bot.core.protocols import Publisher, Snapshot
from bot.core.records import Proposal
from bot.forge.local import LocalForge, init_research_repo
from bot.loop.conductor import Conductor, ConductorConfig
from bot.store import Store
from bot.views.results import ResultsFile, export_tsv

MAIN = with_effect(SMALL_TRAIN_PY, 0.0, "main")
PROGRAM = "---\nautoresearch:\n  first_baseline_runs: 2\n  baseline_runs: 2\n---\n\nLower val_bpb.\n"


class CountingForge:
    """The real local forge, counting how often the loop asks it for main's sha."""

    def __init__(self, forge: LocalForge) -> None:
        self.forge = forge
        self.main_reads = 0

    def main_sha(self) -> str:
        self.main_reads += 1
        return self.forge.main_sha()

    def __getattr__(self, name: str):
        return getattr(self.forge, name)


class Recording(Publisher):
    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    def publish(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)


class Broken(Publisher):
    def publish(self, snapshot: Snapshot) -> None:
        raise RuntimeError("GitHub is down")


def make(tmp_path: Path, proposals: list[Proposal], *, publishers: list[Publisher] = ()) -> Conductor:
    init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": PROGRAM})
    store = Store(tmp_path / "state.db")
    return Conductor(
        store,
        CountingForge(LocalForge(tmp_path / "repo")),
        FakeRunner(),
        ScriptedAgent(proposals),
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=len(proposals)),
        publishers=publishers,
    )


def ticks_until_finished(loop: Conductor, on_tick=lambda: None) -> None:
    """Tick until the loop has nothing more to do, waiting between ticks for the agent's answer."""
    woken = threading.Event()
    loop.wake_on(woken.set)
    for _ in range(400):
        woken.clear()
        loop.tick()
        on_tick()
        if loop.finished():
            return
        woken.wait(timeout=0.05)
    raise AssertionError("the loop never finished")


def better(title: str = "better") -> Proposal:
    return Proposal(title, "a clear gain", with_effect(MAIN, -0.1, title))


def test_a_tick_reads_main_once_and_again_only_after_its_own_merge(tmp_path: Path) -> None:
    loop = make(tmp_path, [better()])
    forge = loop.forge
    ticks: list[tuple[int, bool]] = []  # (main's sha read in the tick, the tick merged)
    before = {"reads": 0, "merged": False}

    def count() -> None:
        merged = any(e.merged_sha for e in loop.store.experiments.all())
        ticks.append((forge.main_reads - before["reads"], merged and not before["merged"]))
        before.update(reads=forge.main_reads, merged=merged)

    ticks_until_finished(loop, count)
    assert [n for n, merged in ticks if merged] == [2]
    assert {n for n, merged in ticks if not merged} == {1}


def test_the_live_summary_reads_no_git(tmp_path: Path) -> None:
    loop = make(tmp_path, [better()])
    ticks_until_finished(loop)
    reads = loop.forge.main_reads
    summary = loop.summary()
    assert loop.forge.main_reads == reads
    assert (summary.experiments, summary.kept) == (1, 1)
    assert summary.best_val_bpb is not None and summary.best_val_bpb < summary.baseline_val_bpb


def test_a_failing_publisher_holds_up_no_other(tmp_path: Path) -> None:
    recording = Recording()
    loop = make(tmp_path, [better()], publishers=[Broken(), recording])
    loop.tick()
    assert len(recording.snapshots) == 1 and recording.snapshots[0].main_sha == loop.forge.main_sha()
    assert any("publishing failed: RuntimeError: GitHub is down" in e["message"] for e in loop.store.events.all())


def test_results_tsv_follows_each_decision_and_idle_ticks_leave_it_alone(tmp_path: Path) -> None:
    path, expected = tmp_path / "results.tsv", tmp_path / "expected.tsv"
    loop = make(tmp_path, [better("first"), better("second")])
    loop.publishers.append(ResultsFile(loop.store, path))
    rows: list[int] = []

    def look() -> None:
        export_tsv(loop.store, expected)
        assert path.read_text() == expected.read_text()  # as the store says, at the end of every tick
        rows.append(len(path.read_text().splitlines()) - 1)

    ticks_until_finished(loop, look)
    assert rows[0] == 0 and 1 in rows and rows[-1] == 3 and rows == sorted(rows)  # the baseline, then the decisions
    path.write_text("edited by hand\n")
    loop.tick()  # a tick that changes nothing it shows writes nothing
    assert path.read_text() == "edited by hand\n"


def test_the_idle_conductor_sizes_each_train_py_in_flight_once(tmp_path: Path, monkeypatch) -> None:
    """The size of a train.py (tens of milliseconds) is worked out while the driver waits, not in the
    tick that collects its run and judges it, while the slots it freed wait."""
    from bot.core import simplicity

    init_research_repo(tmp_path / "repo", {"train.py": MAIN, "program.md": PROGRAM})
    runner = FakeRunner(slots=4, auto=False)
    loop = Conductor(
        Store(tmp_path / "state.db"),
        LocalForge(tmp_path / "repo"),
        runner,
        ScriptedAgent([better("a"), better("b")]),
        ConductorConfig(profile="smoke", identity=dict(IDENTITY), max_experiments=2),
    )
    woken = threading.Event()
    loop.wake_on(woken.set)
    for _ in range(200):
        woken.clear()
        loop.tick()
        if len([e for e in loop.store.experiments.all() if e.asset]) == 2:
            break
        woken.wait(timeout=0.05)
    sized: list[str] = []
    monkeypatch.setattr(simplicity, "size", lambda text: sized.append(text))
    in_flight = {e.asset for e in loop.store.experiments.all()}

    loop.idle(lambda: True)  # something arrived: nothing is done
    assert sized == []
    loop.idle(lambda: False)
    assert set(sized) == in_flight and len(sized) == 2
    loop.idle(lambda: False)  # each once
    assert len(sized) == 2

    # one text that cannot be sized (ast.unparse's RecursionError on a deeply nested one) holds up no other
    loop._sized.clear()
    tried: list[str] = []

    def size(text: str) -> None:
        tried.append(text)
        if len(tried) == 1:
            raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(simplicity, "size", size)
    loop.idle(lambda: False)
    assert set(tried) == in_flight and len(tried) == 2
    loop.idle(lambda: False)  # and it is not tried again at every wait: the verdict sizes it, and says
    assert len(tried) == 2
