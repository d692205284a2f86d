"""The research loop end to end on the CPU (smoke profile): real git repository, real training
runs in child processes, the real offline explorer; and the conductor killed with SIGKILL at each
state transition, then restarted."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest

from bot.agent import AgentError
from bot.agent.explorer import OfflineExplorer
from bot.agent.scripted import ScriptedAgent
from bot.conductor import Conductor, ConductorConfig, ConductorError
from bot.forge.local import LocalForge, init_research_repo
from bot.records import Proposal, ProposalContext, code_hash
from bot.runners.local import LocalRunner
from bot.store import Store

ROOT = Path(__file__).resolve().parents[2]
TRAIN_PY = (ROOT / "train.py").read_text()
pytestmark = pytest.mark.slow


def set_constant(text: str, name: str, value: str) -> str:
    new, count = re.subn(rf"^{name} = [^#\n]*?(\s*#|$)", rf"{name} = {value}\1", text, count=1, flags=re.M)
    assert count == 1, name
    return new


def program(**settings: object) -> str:
    lines = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in settings.items())
    return f"---\nautoresearch:\n{lines}\n---\n\n# Research program\n\nLower val_bpb.\n"


# A main that trains badly on purpose (tiny matrix learning rate): a fix is a sure improvement.
HANDICAPPED = set_constant(TRAIN_PY, "MATRIX_LR", "0.0004")
FIX_MATRIX_LR = set_constant(HANDICAPPED, "MATRIX_LR", "0.04")
# Starts 4 s late (before the harness's clock runs), so it finishes after a run started with it.
SLOW_WARMDOWN = set_constant(HANDICAPPED.replace("import math\n", "import math\nimport time\ntime.sleep(4)\n", 1),
                             "WARMDOWN_RATIO", "0.4")
CRASHING = HANDICAPPED.replace("h = harness.session()", "h = harness.session()\nraise RuntimeError('boom: the crash under test')")


def make_workdir(work: Path, train_py: str, program_md: str) -> LocalForge:
    return init_research_repo(work / "repo", {"train.py": train_py, "program.md": program_md})


def conductor(work: Path, agent, *, slots: int = 1, experiments: int = 0) -> Conductor:
    return Conductor(Store(work / "state.db"), LocalForge(work / "repo"), LocalRunner(work / "runs", slots=slots),
                     agent, ConductorConfig(profile="smoke", max_experiments=experiments, poll_interval_s=0.1),
                     results_tsv=work / "results.tsv")


def main_history(forge: LocalForge) -> list[git.Commit]:
    return list(forge.repo.iter_commits("main", first_parent=True))


class CrashThenRepeat:
    """The real explorer, except that its 2nd proposal crashes and its 3rd repeats the 1st."""

    def __init__(self, seed: int) -> None:
        self.explorer = OfflineExplorer(seed=seed)
        self.calls = 0
        self.first: Proposal | None = None

    def propose(self, ctx: ProposalContext) -> Proposal:
        self.calls += 1
        if self.calls == 2:
            return Proposal("Crash on purpose", "Checks that a crash is recorded and the loop goes on.",
                            ctx.train_py.replace("h = harness.session()",
                                                 "h = harness.session()\nraise ValueError('deliberate crash')"))
        if self.calls == 3 and self.first is not None:
            return self.first
        proposal = self.explorer.propose(ctx)
        self.first = self.first or proposal
        return proposal


def test_the_loop_end_to_end(tmp_path: Path, smoke_prepared) -> None:
    forge = make_workdir(tmp_path, TRAIN_PY, program(baseline_runs=2))
    agent = CrashThenRepeat(seed=3)
    loop = conductor(tmp_path, agent, experiments=4)
    summary = loop.run()
    store = loop.store

    experiments = store.experiments()
    assert len(experiments) == summary.experiments == 4
    assert all(e.state == "done" for e in experiments)
    assert summary.kept + summary.discarded + summary.crashed == 4

    # the deliberate crash is recorded with its traceback, and the loop went on after it
    crashed = [e for e in experiments if e.status == "crash"]
    assert [e.title for e in crashed] == ["Crash on purpose"]
    assert "deliberate crash" in crashed[0].error_tail
    assert crashed[0].id < experiments[-1].id

    # the repeated proposal was refused, not run (if experiment 1 was kept, main now holds its code)
    refusals = [e["message"] for e in store.events() if e["kind"] == "refused"]
    expected = "train.py is identical to main's" if experiments[0].status == "keep" else "repeats experiment 1"
    assert any(experiments[0].title in m and expected in m for m in refusals), refusals
    assert len({e.code_hash for e in experiments}) == 4

    # main advanced only through kept experiments, each commit naming its experiment
    history = main_history(forge)
    kept = [e for e in experiments if e.status == "keep"]
    assert len(history) == 1 + len(kept)
    assert [c.hexsha for c in reversed(history[:-1])] == [e.merged_sha for e in kept]
    for commit, exp in zip(reversed(history[:-1]), kept):
        assert f"autoresearch-experiment: {exp.id}" in commit.message

    # every main commit that changed train.py has a measured val_bpb
    for commit in history:
        text = (commit.tree / "train.py").data_stream.read().decode()
        measured = [r for r in store.runs(code_hash=code_hash(text)) if r.status == "ok" and r.val_bpb]
        assert measured, f"main commit {commit.hexsha[:7]} has no measured val_bpb"

    # discarded and crashed branches stay as a record
    assert set(forge.list_branches()) == {e.branch for e in experiments}

    # results.tsv: the baseline, then one row per experiment
    lines = (tmp_path / "results.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert len(lines) == 1 + 1 + 4
    assert lines[1].split("\t")[3:] == ["keep", "baseline"]
    assert [line.split("\t")[3] for line in lines[2:]] == [e.status for e in experiments]


def test_two_slots_remeasure_on_the_moved_main(tmp_path: Path, smoke_prepared) -> None:
    forge = make_workdir(tmp_path, HANDICAPPED, program(baseline_runs=1, confirm=False))
    # measure main first, so that both experiments are proposed at once, on the same main
    conductor(tmp_path, ScriptedAgent([]), slots=2).run()
    # the sure improvement finishes first and is kept; the other, which starts late and changes
    # another line, was then measured on a main that has moved
    agent = ScriptedAgent([Proposal("Fix MATRIX_LR", "Far too low.", FIX_MATRIX_LR),
                           Proposal("Shorter warmdown", "Cool down over 40% of the budget.", SLOW_WARMDOWN)])
    loop = conductor(tmp_path, agent, slots=2, experiments=2)
    loop.run()
    store = loop.store
    first, second = store.experiments()
    candidates = [r for r in store.runs() if r.purpose == "candidate"]
    assert len(candidates) == 2 and len({r.base_sha for r in candidates}) == 1
    assert first.status == "keep", first.reason

    remeasures = [r for r in store.runs(experiment_id=second.id) if r.purpose == "remeasure"]
    assert len(remeasures) == 1, [(e.title, e.status, e.reason) for e in (first, second)]
    remeasure = remeasures[0]
    assert remeasure.base_sha == first.merged_sha == second.base_sha
    # the graft of train.py onto the new main holds both changes
    assert "MATRIX_LR = 0.04" in remeasure.asset and "WARMDOWN_RATIO = 0.4" in remeasure.asset
    assert second.val_bpb == pytest.approx(remeasure.val_bpb)  # judged on the re-measurement alone
    if second.status == "keep":
        assert forge.repo.commit(second.merged_sha).parents[0].hexsha == first.merged_sha
    assert len(main_history(forge)) == 1 + (first.status == "keep") + (second.status == "keep")


KILL_SCRIPT = """
import json, sys
from pathlib import Path
from bot.agent.scripted import ScriptedAgent
from bot.conductor import Conductor, ConductorConfig
from bot.forge.local import LocalForge
from bot.runners.local import LocalRunner
from bot.store import Store

work = Path(sys.argv[1])
loop = Conductor(Store(work / "state.db"), LocalForge(work / "repo"), LocalRunner(work / "runs", slots=1),
                 ScriptedAgent.from_jsonl(work / "proposals.jsonl"),
                 ConductorConfig(profile="smoke", max_experiments=2, poll_interval_s=0.1),
                 results_tsv=work / "results.tsv")
summary = loop.run()
print(json.dumps({"experiments": summary.experiments, "kept": summary.kept, "crashed": summary.crashed}))
"""


def start_conductor(work: Path, failpoint: str | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("AUTORESEARCH_FAILPOINT", None)
    if failpoint:
        env["AUTORESEARCH_FAILPOINT"] = failpoint
    return subprocess.Popen([sys.executable, str(work / "drive.py"), str(work)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def prepare_kill_workdir(work: Path) -> LocalForge:
    forge = make_workdir(work, HANDICAPPED, program(baseline_runs=1, confirm=False))
    (work / "drive.py").write_text(KILL_SCRIPT)
    proposals = [{"title": "Fix MATRIX_LR", "hypothesis": "Far too low.", "train_py": FIX_MATRIX_LR},
                 {"title": "Crash", "hypothesis": "Crashes.", "train_py": CRASHING}]
    (work / "proposals.jsonl").write_text("\n".join(json.dumps(p) for p in proposals) + "\n")
    return forge


def check_invariants(work: Path, forge: LocalForge) -> None:
    store = Store(work / "state.db")
    experiments = store.experiments()
    # every experiment ended exactly once, with the status its code deserves
    assert [(e.title, e.state, e.status) for e in experiments] == [
        ("Fix MATRIX_LR", "done", "keep"), ("Crash", "done", "crash")]
    for exp in experiments:
        done_events = [e for e in store.events(exp.id) if e["kind"] == "done"]
        assert len(done_events) == 1, f"experiment {exp.id} ended {len(done_events)} times"
    # no branch duplicated, main merged once
    assert forge.list_branches() == [e.branch for e in experiments]
    history = main_history(forge)
    assert len(history) == 2 and history[0].hexsha == experiments[0].merged_sha
    # no result lost: every run finished or was replaced; each experiment was measured
    runs = store.runs()
    assert all(r.state in ("done", "lost") for r in runs)
    for exp in experiments:
        assert [r for r in runs if r.experiment_id == exp.id and r.state == "done"]
    # main measured once before the keep and once after it (the kept runs do not stand in for main)
    assert len([r for r in runs if r.purpose == "baseline" and r.state == "done"]) == 2
    lines = (work / "results.tsv").read_text().splitlines()
    assert [line.split("\t")[3] for line in lines[1:]] == ["keep", "keep", "crash"]
    store.close()


FAILPOINTS = ["queued_baseline", "run_started", "run_done", "proposed", "branched", "queued_candidate",
              "merging", "closing", "done"]


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_killed_at_each_transition_then_restarted(tmp_path: Path, smoke_prepared, failpoint: str) -> None:
    forge = prepare_kill_workdir(tmp_path)
    killed = start_conductor(tmp_path, failpoint)
    _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, f"the failpoint {failpoint} was never reached: {err[-2000:]}"

    resumed = start_conductor(tmp_path)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == {"experiments": 2, "kept": 1, "crashed": 1}
    check_invariants(tmp_path, forge)


def test_killed_while_a_run_is_in_flight_picks_the_run_up_again(tmp_path: Path, smoke_prepared) -> None:
    forge = prepare_kill_workdir(tmp_path)
    proc = start_conductor(tmp_path)
    deadline = time.time() + 120
    while not list((tmp_path / "runs").glob("*/progress.jsonl")):
        assert time.time() < deadline and proc.poll() is None, "no run started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    resumed = start_conductor(tmp_path)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    check_invariants(tmp_path, forge)
    store = Store(tmp_path / "state.db")
    assert not [r for r in store.runs() if r.state == "lost"], "the running job was adopted, not re-run"
    store.close()


def test_a_crashing_main_stops_the_loop_with_a_clear_error(tmp_path: Path, smoke_prepared) -> None:
    make_workdir(tmp_path, CRASHING, program(baseline_runs=1))
    loop = conductor(tmp_path, ScriptedAgent([]), experiments=1)
    with pytest.raises(ConductorError, match=r"train.py on main .* crashed in 2 baseline runs"):
        loop.run()
    # one crash may be bad luck (a NaN, an OOM): main was given a second run before giving up
    assert [r.status for r in loop.store.runs() if r.purpose == "baseline"] == ["crash", "crash"]


def test_an_exhausted_agent_ends_the_loop(tmp_path: Path, smoke_prepared) -> None:
    make_workdir(tmp_path, HANDICAPPED, program(baseline_runs=1))
    summary = conductor(tmp_path, ScriptedAgent([]), experiments=3).run()
    assert summary.experiments == 0
    assert "nothing more to propose" in summary.stop_reason


def test_scripted_agent_reports_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "proposals.jsonl"
    bad.write_text('{"title": "no code"}\n')
    with pytest.raises(AgentError, match="proposals.jsonl:1"):
        ScriptedAgent.from_jsonl(bad)
