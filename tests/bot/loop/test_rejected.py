"""A run refused a number (the evaluator's gate, or training's harness: the causality probe, the
budget cap) ends its experiment `rejected` with the reason: never merged, the agent told why, and
every view saying rejected, where a crash says crashed. The runner is a fake whose results the test
chooses (tests/fakes.py: result_for's `rejected`)."""

from __future__ import annotations

from pathlib import Path

from fakes import FakeRunner, result_for, with_effect
from rich.console import Console

from bot.agent.prompt import volatile_text
from bot.agent.scripted import ScriptedAgent
from bot.core.records import Job, Proposal, RunResult
from bot.forge.local import init_research_repo
from bot.loop.judge import JudgeConfig, Noise, decide
from bot.views import plot, results
from bot.views.read_model import view_of
from bot.views.research_log import facts, log_text
from bot.views.status import render_workdir_status
from runner.tasks import QUERY_LATENCY
from tests.bot.app.test_serve_task import IDENTIFY, QUERY, program
from tests.bot.loop.test_lifecycle import FAST, MAIN, Priced, make, proposal, run_to_end, statuses
from tests.bot.loop.test_lifecycle import program as lifecycle_program

REASON = "the model reads future tokens: its loss at position 3 moved when token 7 changed"


def refused_when_marked(job: Job) -> RunResult:
    """The harness's rejection for a train.py the test marked, a number for any other."""
    return result_for(job, rejected=REASON) if "refused" in job.asset else result_for(job)


def test_a_rejected_train_py_ends_rejected_with_its_reason_and_the_loop_goes_on(tmp_path: Path) -> None:
    agent = Priced([proposal(-0.3, "refused"), proposal(+0.1, "worse")], usd=0.0)
    loop = make(tmp_path, agent, runner=FakeRunner(outcome=refused_when_marked), experiments=2, lookahead=0)
    main_before = loop.forge.main_sha()
    run_to_end(loop)

    assert statuses(loop) == [("refused", "rejected"), ("worse", "discard")]
    rejected = loop.store.experiments.all()[0]
    assert rejected.reason == f"rejected: {REASON}"  # not "the run crashed: rejected: ..."
    assert rejected.error_tail == f"rejected: {REASON}"
    assert rejected.val_bpb is None and rejected.merged_sha is None
    assert loop.forge.main_sha() == main_before  # its number (a gain, had it been measured) never counts
    assert loop.summary().rejected == 1 and loop.summary().crashed == 0
    events = [e["message"] for e in loop.store.events.all() if e["kind"] == "run"]
    assert any(f"rejected: {REASON}" in m for m in events) and not any("crashed" in m for m in events)

    # The agent is told why, once, as a rejection (not as a traceback).
    told = agent.contexts[1]
    assert (told.last_crash_id, told.last_crash_status) == (rejected.id, "rejected")
    prompt = volatile_text(told)
    assert "# The last rejection" in prompt and REASON in prompt and "traceback" not in prompt


def test_a_rejection_reads_rejected_in_results_tsv_and_the_research_log(tmp_path: Path) -> None:
    runner = FakeRunner(outcome=refused_when_marked)
    loop = make(tmp_path, Priced([proposal(-0.3, "refused")], usd=0.0), runner=runner, experiments=1)
    run_to_end(loop)
    view = view_of(loop.store)
    [row] = [line.split("\t") for line in results.to_tsv(view).splitlines()[2:]]
    assert (row[1], row[3]) == ("", "rejected")  # no value, where a crash's is 0.000000
    now = loop.store.experiments.all()[0].updated_at
    assert "1 finished: 0 kept, 0 discarded, 0 crashed, 1 rejected;" in log_text(facts(view, now), now, 60_000)
    console = Console(record=True, width=200)
    console.print(render_workdir_status(view))
    assert "kept 0, discarded 0, crashed 0, rejected 1, failed 0" in console.export_text()
    data = plot.write_chart(loop.store, tmp_path / "progress.svg")
    assert (data.crashed, data.rejected, data.crashes) == (0, 1, [1])
    svg = (tmp_path / "progress.svg").read_text()
    assert "1 experiments, 0 kept, 1 rejected" in svg and "rejection (1)" in svg and "crashed" not in svg


def test_a_rejection_wins_over_any_number_and_says_its_reason_first_line() -> None:
    decision = decide(
        candidate=[0.5],
        crash=None,
        rejected="query.sql attaches another database: ATTACH 'x.db'\nmore detail",
        main=[1.0, 1.0],
        noise=Noise(sigma=0.01, dof=30),
        measured_on="a" * 40,
        current_main="a" * 40,
        config=JudgeConfig(),
    )
    assert (decision.action, decision.reason) == (
        "rejected",
        "rejected: query.sql attaches another database: ATTACH 'x.db'",
    )
    assert (decision.val_bpb, decision.delta, decision.margin) == (None, None, None)


def test_a_query_the_evaluator_rejects_ends_rejected_in_the_tasks_words(tmp_path: Path) -> None:
    """The query-latency task: a query.sql that returns other rows is rejected with the gate's reason,
    its row in results.tsv (p95_ms) empty and rejected, and nothing it says is a crash."""
    why = "query.sql returns 5 rows for parameter set 1, the reference returns 10"

    def gate(job: Job) -> RunResult:
        if "LIMIT 5;" in job.asset:
            return result_for(job, identity=IDENTIFY, rejected=why)
        return result_for(job, identity=IDENTIFY, val_bpb=QUERY_LATENCY.metric.loss(20.0 + job.run_id % 3 / 100))

    forge = init_research_repo(tmp_path / "repo", {"query.sql": QUERY, "program.md": program()})
    other_rows = Proposal("Keep only the top five", "Fewer rows to sort.", QUERY.replace("LIMIT 10;", "LIMIT 5;"))
    loop = make(tmp_path, ScriptedAgent([other_rows]), forge=forge, runner=FakeRunner(outcome=gate), identity=IDENTIFY)
    run_to_end(loop)

    [exp] = loop.store.experiments.all()
    assert (exp.status, exp.reason, exp.merged_sha) == ("rejected", f"rejected: {why}", None)
    tsv = results.to_tsv(view_of(loop.store)).splitlines()
    assert tsv[0].split("\t")[:4] == ["commit", "p95_ms", "memory_gb", "status"]
    assert tsv[2].split("\t")[1:4] == ["", "0.0", "rejected"]
    assert not any("crash" in e["message"] for e in loop.store.events.all())


def test_a_main_rejected_twice_in_a_row_blocks_the_loop_saying_so(tmp_path: Path) -> None:
    refused_main = with_effect(MAIN, 0.0, "refused")
    forge = init_research_repo(tmp_path / "repo", {"train.py": refused_main, "program.md": lifecycle_program(**FAST)})
    loop = make(tmp_path, ScriptedAgent([]), forge=forge, runner=FakeRunner(outcome=refused_when_marked))
    run_to_end(loop)
    assert "was rejected in 2 baseline runs in a row" in loop.blocked and REASON in loop.blocked
