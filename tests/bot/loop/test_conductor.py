"""The research loop end to end through the driver, with the real explorer and real git; and the
conductor killed with SIGKILL at each transition, then restarted (each conductor a process of its
own, forked by conductor_forks.py from one interpreter that imported it once). The runners are fakes whose
numbers the test chooses, so no verdict and no reached state depends on training noise; the one
end-to-end run with real training is the demo's, in tests/bot/app/test_cli.py."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import git
import pytest
from fakes import CRASH_MARK, IDENTITY, SMALL_TRAIN_PY, FakeRunner, with_effect

from bot.agent.explorer import OfflineExplorer
from bot.agent.scripted import ScriptedAgent
from bot.core.protocols import AgentError
from bot.core.records import Proposal, ProposalContext, code_hash
from bot.forge.local import LocalForge, init_research_repo
from bot.loop.conductor import Conductor, ConductorConfig
from bot.loop.driver import Driver
from bot.loop.inbox import submit
from bot.store import Store
from bot.views.results import ResultsFile

ROOT = Path(__file__).resolve().parents[3]
TESTS = Path(__file__).resolve().parents[2]
TRAIN_PY = (ROOT / "train.py").read_text()


def set_constant(text: str, name: str, value: str) -> str:
    new, count = re.subn(rf"^{name} = [^#\n]*?(\s*#|$)", rf"{name} = {value}\1", text, count=1, flags=re.M)
    assert count == 1, name
    return new


def program(**settings: object) -> str:
    lines = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in settings.items())
    return f"---\nautoresearch:\n{lines}\n---\n\n# Research program\n\nLower val_bpb.\n"


def make_workdir(work: Path, asset: str, program_md: str) -> LocalForge:
    return init_research_repo(work / "repo", {"train.py": asset, "program.md": program_md})


def conductor(work: Path, agent, *, experiments: int = 0) -> Conductor:
    store = Store(work / "state.db")
    return Conductor(
        store,
        LocalForge(work / "repo"),
        FakeRunner(),
        agent,
        ConductorConfig(profile="smoke", identity=IDENTITY, max_experiments=experiments),
        publishers=[ResultsFile(store, work / "results.tsv")],
    )


def main_history(forge: LocalForge) -> list[git.Commit]:
    return list(forge.repo.iter_commits("main", first_parent=True))


class CrashThenRepeat:
    """The real explorer, except that its 2nd proposal crashes and its 3rd repeats the 1st. Its own
    proposals are marked clearly worse for the fake runner, so every verdict is chosen, none noise."""

    def __init__(self, seed: int) -> None:
        self.explorer = OfflineExplorer(seed=seed)
        self.calls = 0
        self.first: Proposal | None = None

    def propose(self, ctx: ProposalContext) -> Proposal:
        self.calls += 1
        if self.calls == 2:
            return Proposal(
                "Crash on purpose",
                "Checks that a crash is recorded and the loop goes on.",
                ctx.asset.replace("import math\n", "import math" + CRASH_MARK, 1),
            )
        if self.calls == 3 and self.first is not None:
            return self.first
        proposal = self.explorer.propose(ctx)
        proposal = Proposal(
            proposal.title, proposal.hypothesis, with_effect(proposal.asset, +0.1, proposal.title), proposal.meta
        )
        self.first = self.first or proposal
        return proposal


def test_the_loop_end_to_end_with_the_real_explorer(tmp_path: Path) -> None:
    """The whole loop through the driver; the runner is a fake (the CLI's demo test trains for real)."""
    forge = make_workdir(tmp_path, with_effect(TRAIN_PY, 0.0, "main"), program(first_baseline_runs=2, baseline_runs=2))
    agent = CrashThenRepeat(seed=3)
    loop = conductor(tmp_path, agent, experiments=4)
    summary = Driver(loop, timer_s=0.05).run()
    store = loop.store

    experiments = store.experiments.all()
    assert len(experiments) == summary.experiments == 4
    assert all(e.state == "done" for e in experiments)
    assert [e.status for e in experiments] == ["discard", "crash", "discard", "discard"]

    # the deliberate crash is recorded with its traceback, and the loop went on after it
    crashed = [e for e in experiments if e.status == "crash"]
    assert [e.title for e in crashed] == ["Crash on purpose"]
    assert "boom" in crashed[0].error_tail
    assert crashed[0].id < experiments[-1].id

    # the repeated proposal was refused, not run
    refusals = [e["message"] for e in store.events.all() if e["kind"] == "refused"]
    assert any(experiments[0].title in m and "repeats experiment 1" in m for m in refusals), refusals
    assert len({e.code_hash for e in experiments}) == 4

    # main advanced only through kept experiments, each commit naming its experiment
    history = main_history(forge)
    kept = [e for e in experiments if e.status == "keep"]
    assert len(history) == 1 + len(kept)
    assert [c.hexsha for c in reversed(history[:-1])] == [e.merged_sha for e in kept]
    for commit, exp in zip(reversed(history[:-1]), kept, strict=True):
        assert f"autoresearch-experiment: {exp.id}" in commit.message

    # every main commit that changed train.py has a measured val_bpb
    for commit in history:
        text = (commit.tree / "train.py").data_stream.read().decode()
        measured = [r for r in store.runs.all(code_hash=code_hash(text)) if r.status == "ok" and r.val_bpb]
        assert measured, f"main commit {commit.hexsha[:7]} has no measured val_bpb"

    # discarded and crashed branches stay as a record
    assert set(forge.list_branches()) == {e.branch for e in experiments}

    # results.tsv: the baseline, then one row per experiment
    lines = (tmp_path / "results.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert len(lines) == 1 + 1 + 4
    assert lines[1].split("\t")[3:] == ["keep", "baseline"]
    assert [line.split("\t")[3] for line in lines[2:]] == [e.status for e in experiments]


MAIN_FOR_KILLS = with_effect(SMALL_TRAIN_PY, 0.0, "main")


class Conductors:
    """Starts conductor processes on a work directory through conductor_forks.py: one interpreter
    that imported the conductor once and forks a fresh process for each start."""

    def __init__(self, errors: Path) -> None:
        env = dict(os.environ)
        env.pop("AUTORESEARCH_FAILPOINT", None)
        self.errors = errors
        with errors.open("w") as stderr:
            self.server = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("conductor_forks.py")), str(TESTS)],
                env=env,
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )

    def run(self, work: Path, failpoint: str | None = None) -> int:
        """Run a conductor on `work` until it ends (or its failpoint kills it); its return code."""
        assert self.server.stdin and self.server.stdout
        self.server.stdin.write(json.dumps({"work": str(work), "failpoint": failpoint}) + "\n")
        self.server.stdin.flush()
        ready, _, _ = select.select([self.server.stdout], [], [], 120)
        assert ready, f"the conductor on {work} did not end within 120 s: see {work / 'conductor.err'}"
        answer = self.server.stdout.readline()
        assert answer, f"conductor_forks.py ended: {self.errors.read_text()[-3000:]}"
        return json.loads(answer)["returncode"]

    def close(self) -> None:
        self.server.communicate(timeout=60)  # the end of its input ends the server


@pytest.fixture(scope="module")
def conductors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Conductors]:
    started = Conductors(tmp_path_factory.mktemp("conductors") / "server.err")
    yield started
    started.close()


def prepare_kill_workdir(work: Path) -> LocalForge:
    forge = make_workdir(work, MAIN_FOR_KILLS, program(first_baseline_runs=2, baseline_runs=2))
    proposals = [
        {"title": "Fix MATRIX_LR", "hypothesis": "Far too low.", "train_py": with_effect(SMALL_TRAIN_PY, -0.1)},
        {
            "title": "Crash",
            "hypothesis": "Crashes.",
            "train_py": MAIN_FOR_KILLS.replace("import math\n", "import math" + CRASH_MARK, 1),
        },
    ]
    (work / "proposals.jsonl").write_text("\n".join(json.dumps(p) for p in proposals) + "\n")
    store = Store(work / "state.db")
    submit(store, "steer", {"text": "be bold"}, author="alice", key="delivery-1")
    store.close()
    return forge


def check_invariants(work: Path, forge: LocalForge) -> None:
    store = Store(work / "state.db")
    experiments = store.experiments.all()
    # every experiment ended exactly once, with the status its code deserves
    assert [(e.title, e.state, e.status) for e in experiments] == [
        ("Fix MATRIX_LR", "done", "keep"),
        ("Crash", "done", "crash"),
    ]
    for exp in experiments:
        done_events = [e for e in store.events.all(exp.id) if e["kind"] == "done"]
        assert len(done_events) == 1, f"experiment {exp.id} ended {len(done_events)} times"
    # no branch duplicated, main merged once
    assert forge.list_branches() == [e.branch for e in experiments]
    history = main_history(forge)
    assert len(history) == 2 and history[0].hexsha == experiments[0].merged_sha
    # no result lost or measured twice: every run finished, or was cancelled unrun because main
    # moved under it; none was lost (the fake runner goes on while the conductor is dead, and a
    # resubmitted run id starts nothing new)
    runs = store.runs.all()
    assert [
        (r.id, r.state, r.note)
        for r in runs
        if r.state != "done" and not (r.state == "cancelled" and "main moved" in (r.note or ""))
    ] == []
    for exp in experiments:
        assert [r for r in runs if r.experiment_id == exp.id and r.state == "done"]
    # main measured twice before the keep and twice after it (the kept runs do not stand in for main)
    assert len([r for r in runs if r.purpose == "baseline"]) == 4
    assert experiments[0].remeasured_delta == pytest.approx(-0.1, abs=0.002)
    # the inbox entry was applied exactly once
    assert store.feedback.recent() == ["be bold"] and all(e.processed_at for e in store.inbox.all())
    lines = (work / "results.tsv").read_text().splitlines()
    assert [line.split("\t")[3] for line in lines[1:]] == ["keep", "keep", "crash"]
    store.close()


FAILPOINTS = [
    "inbox_applied",
    "queued_baseline",
    "run_started",
    "run_done",
    "proposing",
    "proposed",
    "branched",
    "queued_candidate",
    "merging",
    "closing",
    "done",
]


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_killed_at_each_transition_then_restarted(tmp_path: Path, failpoint: str, conductors: Conductors) -> None:
    forge = prepare_kill_workdir(tmp_path)
    errors = tmp_path / "conductor.err"
    killed = conductors.run(tmp_path, failpoint)
    assert killed == -signal.SIGKILL, f"the failpoint {failpoint} was never reached: {errors.read_text()[-2000:]}"
    assert not (tmp_path / "summary.json").exists()

    resumed = conductors.run(tmp_path)
    assert resumed == 0, errors.read_text()[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text()) == {"experiments": 2, "kept": 1, "crashed": 1}
    check_invariants(tmp_path, forge)


def test_scripted_agent_reports_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "proposals.jsonl"
    bad.write_text('{"title": "no code"}\n')
    with pytest.raises(AgentError, match="proposals.jsonl:1"):
        ScriptedAgent.from_jsonl(bad)
