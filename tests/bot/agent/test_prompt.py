"""What Claude is told: the stable rules, the cached context block and the compact volatile one."""

from __future__ import annotations

import math
from pathlib import Path

from bot.agent.prompt import HISTORY_IN_FULL, IN_FLIGHT_CHARS, context_blocks, history_line, system_prompt
from bot.core.records import HistoryEntry, ProposalContext

REPO = Path(__file__).resolve().parents[3]
TRAIN_PY = (REPO / "train.py").read_text()
PROGRAM_MD = (REPO / "program.md").read_text()
STATUSES = ("keep", "discard", "discard", "crash", "discard")


def entry(i: int, status: str | None = None) -> HistoryEntry:
    status = status or STATUSES[i % len(STATUSES)]
    return HistoryEntry(
        id=i,
        title=f"Raise MATRIX_LR to 0.0{i % 9 + 1} and adjust the warmup accordingly",
        hypothesis="A long hypothesis that the history line leaves out. " * 5,
        status=status,
        val_bpb=None if status == "crash" else 1.5 + i / 1000,
        delta=None if status == "crash" else (-0.01 if status == "keep" else 0.004),
        code_hash=f"{i:064x}",
        margin=0.0035,
        lesson="kept: beat main by 2.9 margins"
        if status == "keep"
        else "discarded: within the noise"
        if status == "discard"
        else "crashed: CUDA out of memory",
    )


def context(**changes) -> ProposalContext:
    fields = dict(
        program_md=PROGRAM_MD,
        asset=TRAIN_PY,
        main_val_bpb=1.512345,
        history=[entry(i) for i in range(1, 6)],
        profile="cpu",
        device_kind="cpu",
        main_sha="a" * 40,
    )
    fields.update(changes)
    return ProposalContext(**fields)


def test_the_system_prompt_states_the_rules():
    text = system_prompt()
    for phrase in (
        "only file you may change",
        "harness.session()",
        "h.step_done(loss)",
        "One idea per experiment",
        "fixed training time",
        "Never try to fool the metric",
        "validation data",
        "submit",
        "fixes_failure",
    ):
        assert phrase in text, phrase
    assert system_prompt() == text  # stable: the same every time, so it caches


def test_the_stable_block_holds_program_md_and_mains_train_py_and_is_cached():
    stable, volatile = context_blocks(context())
    assert stable["cache_control"] == {"type": "ephemeral"}
    assert PROGRAM_MD.strip() in stable["text"] and TRAIN_PY.rstrip() in stable["text"]
    assert "cache_control" not in volatile
    assert "1.512345" not in stable["text"]  # nothing volatile before the breakpoint


def test_the_stable_block_does_not_change_with_history_or_feedback():
    a = context_blocks(context())[0]
    b = context_blocks(
        context(
            history=[entry(i) for i in range(1, 30)],
            feedback=["/try a deeper model"],
            main_val_bpb=1.4,
            last_crash="Traceback ...",
            last_crash_id=3,
        )
    )[0]
    assert a == b


def test_the_volatile_block_holds_main_history_feedback_and_the_crash():
    ctx = context(
        feedback=["Please keep the model small.", "/try a cosine warmdown"],
        last_crash='Traceback (most recent call last):\n  File "train.py", line 3\nRuntimeError: CUDA out of memory',
        last_crash_id=4,
    )
    text = context_blocks(ctx)[1]["text"]
    assert "1.512345" in text and "Profile cpu on cpu" in text
    assert "Please keep the model small." in text and "/try a cosine warmdown" in text
    assert "experiment #4" in text and "RuntimeError: CUDA out of memory" in text
    assert "#5 keep d=-0.0100 m=0.0035 Raise MATRIX_LR" in text and "#1 discard d=+0.0040" in text


def test_the_proposals_being_tried_are_shown_with_their_diffs_as_not_to_repeat():
    running = [entry(6, "running"), entry(7, "running")]
    diff = "@@ -1,1 +1,1 @@\n-MATRIX_LR = 0.04\n+MATRIX_LR = 0.05"
    ctx = context(history=[entry(i) for i in range(1, 6)] + running, in_flight={6: diff, 7: ""})
    text = context_blocks(ctx)[1]["text"]
    assert "# Being tried now: 2 proposals not judged yet" in text and "propose something different" in text
    assert "## #6 Raise MATRIX_LR" in text and f"```diff\n{diff}\n```" in text
    assert "## #7 Raise MATRIX_LR" in text  # made on an older main: its title only
    assert "Being tried now" not in context_blocks(context())[1]["text"]


def test_the_diffs_being_tried_stop_at_their_share_of_the_context():
    big = "+" + "x" * (IN_FLIGHT_CHARS // 2)
    ctx = context(history=[entry(i, "running") for i in range(1, 4)], in_flight={1: big, 2: big, 3: "+y = 1"})
    text = context_blocks(ctx)[1]["text"]
    assert text.count(big) == 1 and "+y = 1" in text  # the second big one is left out, the small one fits
    assert "## #2" in text


def test_a_history_line_has_id_status_delta_margin_title_and_lesson():
    line = history_line(entry(2, "discard"))
    assert line.startswith("#2 discard d=+0.0040 m=0.0035 Raise MATRIX_LR to 0.03")
    assert line.endswith("| discarded: within the noise")
    assert "hypothesis" not in line
    crash = history_line(entry(3, "crash"))
    assert crash.startswith("#3 crash m=0.0035 Raise") and "d=" not in crash


def test_a_fifty_experiment_history_stays_a_few_thousand_tokens():
    text = context_blocks(context(history=[entry(i) for i in range(1, 51)]))[1]["text"]
    assert len(text.splitlines()) < 60
    assert len(text) / 4 < 3500  # about four characters a token


def test_older_experiments_are_summarised_by_counts():
    history = [entry(i) for i in range(1, 101)]
    text = context_blocks(context(history=history))[1]["text"]
    older = history[:-HISTORY_IN_FULL]
    assert f"#1-#{older[-1].id}: {len(older)} earlier experiments" in text
    assert "(8 crash, 24 discard, 8 keep)" in text
    assert f"\n#{older[-1].id} " not in text and f"\n#{older[-1].id + 1} " in text
    assert "Kept among them" in text


def test_a_first_proposal_on_an_unmeasured_main_says_so():
    text = context_blocks(context(history=[], main_val_bpb=None))[1]["text"]
    assert "No experiments yet" in text and "main has not been measured yet" in text
    assert "Feedback" not in text and "crash" not in text


def test_a_long_crash_tail_is_cut_to_its_end():
    tail = "\n".join(f"frame {i}" for i in range(500)) + "\nValueError: the end"
    text = context_blocks(context(last_crash=tail, last_crash_id=9))[1]["text"]
    assert "ValueError: the end" in text and "frame 10\n" not in text


def test_a_query_latency_context_shows_query_sql_and_p95_in_milliseconds():
    query = "CREATE INDEX i ON orders(customer_id);\nSELECT 1;\n"
    ctx = context(asset=query, task="query-latency", main_val_bpb=math.log(12.5), history=[entry(2, "discard")])
    stable, volatile = (block["text"] for block in context_blocks(ctx))
    assert "# query.sql on main (commit aaaaaaaaaaaa): also at /repo/query.sql" in stable
    assert f"```sql\n{query.rstrip()}\n```" in stable
    assert "main's p95_ms is 12.50 (milliseconds, the mean of its baseline runs; lower is better)" in volatile
    assert "d = p95_ms relative to main's at the time, negative is better" in volatile
    assert "#2 discard d=+0.4% m=0.3%" in volatile  # log p95 +0.004: +0.4%; margin 0.0035: a gain of 0.3%
    assert "change to /repo/query.sql" in volatile
    system = system_prompt("query-latency")
    assert "you improve query.sql" in system and "scored by p95_ms (milliseconds; lower is better)" in system
    assert "train.py" not in system and "harness" not in system
