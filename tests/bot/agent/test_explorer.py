"""The offline explorer: one-line edits of train.py's constants, chosen by a bandit that learns."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from bot.agent.batch import batch_splits
from bot.agent.constants import find_constants
from bot.agent.crash_memory import CRASH_MEMORY, skeleton
from bot.agent.explorer import OfflineExplorer
from bot.agent.knobs import KNOB_BY_NAME
from bot.core.protocols import Agent, AgentStopped
from bot.core.records import HistoryEntry, Proposal, ProposalContext, code_hash
from runner.profiles import get_profile

TRAIN_PY = '''"""A tiny GPT training script (test fixture)."""
import math

# ---------------------------------------------------------------------------
# Hyperparameters: the agent's main knobs
# ---------------------------------------------------------------------------
# Model shape and batch on a GPU (profile h100)
DEPTH = 8                    # transformer layers
ASPECT_RATIO = 64            # model_dim = DEPTH * ASPECT_RATIO, rounded up to a multiple of HEAD_DIM
HEAD_DIM = 128               # attention head size
TOTAL_BATCH_SIZE = 2**19     # tokens per optimizer step: a multiple of DEVICE_BATCH_SIZE * seq_len
DEVICE_BATCH_SIZE = 128      # sequences per forward pass (seq_len is 2048 on h100)
# Model shape and batch on the CPU (profiles cpu and smoke: seq_len 256 and 128)
CPU_DEPTH = 2
CPU_ASPECT_RATIO = 64
CPU_HEAD_DIM = 32
CPU_TOTAL_BATCH_SIZE = 2**12
CPU_DEVICE_BATCH_SIZE = 16
# Attention
WINDOW_PATTERN = "SSSL"      # per layer, cycled: S = half context, L = full context; last layer is L
LOGIT_SOFTCAP = 15.0         # logits = cap * tanh(logits / cap)
# Optimization
EMBEDDING_LR = 0.6           # AdamW, token and value embeddings
UNEMBEDDING_LR = 0.004       # AdamW, output head
MATRIX_LR = 0.04             # Muon, every matrix inside the blocks
SCALAR_LR = 0.5              # AdamW, per-layer residual and x0 scalars
WEIGHT_DECAY = 0.2           # Muon matrices only, cautious, decays with the schedule
ADAM_BETA1 = 0.8
ADAM_BETA2 = 0.95
MUON_MOMENTUM = 0.95
MUON_BETA2 = 0.95            # NorMuon: decay of each neuron's running mean square update
WARMUP_RATIO = 0.0           # fraction of the budget spent warming the learning rate up
WARMDOWN_RATIO = 0.5         # fraction of the budget spent cooling it down at the end
FINAL_LR_FRAC = 0.0          # learning rate at the very end, as a fraction of the peak
LOSS_LIMIT = 100.0           # a training loss above this stops the run at once: it has blown up
SOME_OTHER_LR = 0.1          # not in the explorer's table: never touched


def model_dim(depth: int, aspect: int, head_dim: int) -> int:
    return math.ceil(depth * aspect / head_dim) * head_dim


def lr_at(progress: float) -> float:
    if progress < WARMUP_RATIO:
        return MATRIX_LR * progress / max(WARMUP_RATIO, 1e-9)
    if progress > 1 - WARMDOWN_RATIO:
        frac = (1 - progress) / WARMDOWN_RATIO
        return MATRIX_LR * (frac + (1 - frac) * FINAL_LR_FRAC)
    return MATRIX_LR


if __name__ == "__main__":
    print(model_dim(DEPTH, ASPECT_RATIO, HEAD_DIM), TOTAL_BATCH_SIZE // DEVICE_BATCH_SIZE, WINDOW_PATTERN, lr_at(0.9))
'''

GPU_SIZES = {"DEPTH", "ASPECT_RATIO", "HEAD_DIM", "TOTAL_BATCH_SIZE", "DEVICE_BATCH_SIZE"}
CPU_SIZES = {f"CPU_{n}" for n in GPU_SIZES}


def ctx_for(
    asset: str = TRAIN_PY, history=None, device_kind: str = "cpu", profile: str | None = None, **kw
) -> ProposalContext:
    return ProposalContext(
        program_md="Lower val_bpb.",
        asset=asset,
        main_val_bpb=1.0,
        history=list(history or []),
        device_kind=device_kind,
        profile=profile or ("cpu" if device_kind == "cpu" else "h100"),
        **kw,
    )


def changed_lines(old: str, new: str) -> list[tuple[str, str]]:
    """(old line, new line) for every line that differs; both texts must have the same line count."""
    a, b = old.splitlines(), new.splitlines()
    assert len(a) == len(b)
    return [(x, y) for x, y in zip(a, b, strict=True) if x != y]


def set_constant(text: str, name: str, value: str) -> str:
    const = find_constants(text)[name]
    lines = text.splitlines(keepends=True)
    line = lines[const.lineno - 1]
    lines[const.lineno - 1] = line[: const.start] + value + line[const.end :]
    return "".join(lines)


def changes(p: Proposal) -> list[dict]:
    return p.meta["changes"]


def entry(i: int, p_or_meta, status: str, delta: float | None, asset: str = "") -> HistoryEntry:
    meta = p_or_meta.meta if isinstance(p_or_meta, Proposal) else p_or_meta
    text = p_or_meta.asset if isinstance(p_or_meta, Proposal) else asset
    return HistoryEntry(
        id=i,
        title=f"exp {i}",
        hypothesis="",
        status=status,
        val_bpb=None if delta is None else 1.0 + delta,
        delta=delta,
        code_hash=code_hash(text or f"exp {i}"),
        meta=meta,
    )


def run_loop(
    explorer: OfflineExplorer, ctx: ProposalContext, n: int, status: str = "discard", delta: float | None = 0.01
) -> list[Proposal]:
    """Propose n times, feeding each proposal back as a finished experiment."""
    out = []
    for _ in range(n):
        p = explorer.propose(ctx)
        out.append(p)
        ctx.seen_hashes.add(code_hash(p.asset))
        ctx.history.append(entry(len(ctx.history) + 1, p, status, delta))
    return out


def in_bounds(name: str, value) -> bool:
    knob = KNOB_BY_NAME[name]
    if knob.kind == "choice":
        return value in knob.choices
    return knob.lo <= value <= knob.hi or (knob.zero_ok and value == 0)


# ---------------------------------------------------------------------------------------------
# The shape of a proposal
# ---------------------------------------------------------------------------------------------


def test_explorer_is_an_agent():
    assert isinstance(OfflineExplorer(), Agent)


def test_questions_asked_at_once_get_the_best_and_the_next_best_move_never_the_same():
    explorer = OfflineExplorer()
    ctx = ctx_for()  # two questions open at once: the same context, neither knows the other's answer
    first, second = explorer.propose(ctx), explorer.propose(ctx)
    assert code_hash(first.asset) != code_hash(second.asset)
    assert first.asset == OfflineExplorer().propose(ctx).asset  # the first is the move it always makes
    seen = replace(ctx, seen_hashes={code_hash(first.asset)})
    assert second.asset == OfflineExplorer().propose(seen).asset  # the second: the best one left


def test_questions_on_many_threads_at_once_get_distinct_moves():
    explorer, ctx = OfflineExplorer(), ctx_for()
    with ThreadPoolExecutor(8) as pool:
        proposals = list(pool.map(lambda _: explorer.propose(ctx), range(8)))
    assert len({code_hash(p.asset) for p in proposals}) == 8


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
@pytest.mark.parametrize("seed", range(6))
def test_proposal_changes_exactly_one_constant(seed, device_kind):
    p = OfflineExplorer(seed).propose(ctx_for(device_kind=device_kind))
    diff = changed_lines(TRAIN_PY, p.asset)
    assert len(diff) == 1, diff
    ((old_line, new_line),) = diff
    # Same name, same comment: only the value's span changed.
    name = old_line.split("=")[0].strip()
    assert new_line.startswith(old_line.split("=")[0] + "=")
    if "#" in old_line:
        assert new_line[new_line.index("#") :] == old_line[old_line.index("#") :]
    compile(p.asset, "train.py", "exec")
    (change,) = changes(p)
    assert change["name"] == name
    new_value = find_constants(p.asset)[name].value
    assert new_value == change["new"] != change["old"] == find_constants(TRAIN_PY)[name].value
    assert change["direction"] in (1, -1)
    assert in_bounds(name, new_value)
    assert p.title and len(p.title) < 80 and name in p.title
    assert name in p.hypothesis and len(p.hypothesis) > 80


def test_every_line_but_one_is_byte_identical_including_crlf():
    crlf = TRAIN_PY.replace("\n", "\r\n")
    p = OfflineExplorer(0).propose(ctx_for(crlf))
    old, new = crlf.splitlines(keepends=True), p.asset.splitlines(keepends=True)
    assert len(old) == len(new)
    assert sum(a != b for a, b in zip(old, new, strict=True)) == 1
    assert all(line.endswith("\r\n") for line in new)


def test_powers_of_two_are_written_back_as_powers():
    ctx = ctx_for(feedback=["try a higher cpu_total_batch_size"])
    p = OfflineExplorer(0).propose(ctx)
    assert changed_lines(TRAIN_PY, p.asset) == [("CPU_TOTAL_BATCH_SIZE = 2**12", "CPU_TOTAL_BATCH_SIZE = 2**13")]
    assert p.title == "Raise CPU_TOTAL_BATCH_SIZE 2**12 -> 2**13"


@pytest.mark.parametrize("seed", range(3))
def test_many_proposals_stay_in_bounds_and_compile(seed):
    ctx = ctx_for()
    for p in run_loop(OfflineExplorer(seed), ctx, 60):
        compile(p.asset, "train.py", "exec")
        for ch in changes(p):
            assert in_bounds(ch["name"], ch["new"]), ch


# ---------------------------------------------------------------------------------------------
# Which constants are live
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device_kind, forbidden", [("cpu", GPU_SIZES), ("cuda", CPU_SIZES)])
def test_device_kind_selects_the_live_size_constants(device_kind, forbidden):
    touched: set[str] = set()
    for seed in range(3):
        ctx = ctx_for(device_kind=device_kind)
        for p in run_loop(OfflineExplorer(seed), ctx, 40):
            touched |= {ch["name"] for ch in changes(p)}
    assert not touched & forbidden
    assert "SOME_OTHER_LR" not in touched
    allowed = CPU_SIZES if device_kind == "cpu" else GPU_SIZES
    assert touched & allowed, "the live size constants are tuned too"
    assert touched & {"MATRIX_LR", "WARMDOWN_RATIO", "WINDOW_PATTERN"}, "shared constants are tuned too"


def test_gpu_feedback_on_cpu_maps_to_the_cpu_constant():
    p = OfflineExplorer(0).propose(ctx_for(feedback=["make the model deeper: more depth"]))
    assert changes(p)[0]["name"] == "CPU_DEPTH" and changes(p)[0]["direction"] == 1


# ---------------------------------------------------------------------------------------------
# Determinism and novelty
# ---------------------------------------------------------------------------------------------


def test_deterministic_for_the_same_seed_and_context():
    history = [entry(1, {"changes": [{"name": "MATRIX_LR", "old": 0.03, "new": 0.04, "direction": 1}]}, "keep", -0.01)]
    a = OfflineExplorer(7).propose(ctx_for(history=history))
    b = OfflineExplorer(7).propose(ctx_for(history=history))
    assert (a.title, a.hypothesis, a.asset, a.meta) == (b.title, b.hypothesis, b.asset, b.meta)


def test_different_seeds_can_differ():
    titles = {OfflineExplorer(seed).propose(ctx_for()).title for seed in range(10)}
    assert len(titles) > 1


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_never_repeats_a_train_py(device_kind):
    ctx = ctx_for(device_kind=device_kind)
    main_hash = code_hash(TRAIN_PY)
    proposals = run_loop(OfflineExplorer(0), ctx, 40)
    hashes = [code_hash(p.asset) for p in proposals]
    assert len(set(hashes)) == 40
    assert main_hash not in hashes


def test_skips_a_candidate_already_seen():
    first = OfflineExplorer(0).propose(ctx_for())
    second = OfflineExplorer(0).propose(ctx_for(seen_hashes={code_hash(first.asset)}))
    assert code_hash(second.asset) != code_hash(first.asset)


# ---------------------------------------------------------------------------------------------
# Learning from history
# ---------------------------------------------------------------------------------------------


def test_pushes_further_in_a_direction_that_was_kept():
    kept_main = TRAIN_PY.replace("MATRIX_LR = 0.04", "MATRIX_LR = 0.06")
    history = [
        entry(
            1, {"changes": [{"name": "MATRIX_LR", "old": 0.04, "new": 0.06, "direction": 1}]}, "keep", -0.02, kept_main
        )
    ]
    pushed = 0
    for seed in range(10):
        p = OfflineExplorer(seed).propose(ctx_for(kept_main, history, seen_hashes={code_hash(TRAIN_PY)}))
        ch = changes(p)
        if len(ch) == 1 and ch[0]["name"] == "MATRIX_LR" and ch[0]["new"] > 0.06:
            pushed += 1
            assert "kept" in p.hypothesis and "-0.0200" in p.hypothesis
    assert pushed > 5


def test_does_not_repeat_a_direction_that_hurt():
    hurt = TRAIN_PY.replace("MATRIX_LR = 0.04", "MATRIX_LR = 0.06")
    history = [
        entry(
            1, {"changes": [{"name": "MATRIX_LR", "old": 0.04, "new": 0.06, "direction": 1}]}, "discard", +0.015, hurt
        )
    ]
    lowered = 0
    for seed in range(10):
        p = OfflineExplorer(seed).propose(ctx_for(history=history, seen_hashes={code_hash(hurt)}))
        for ch in changes(p):
            assert not (ch["name"] == "MATRIX_LR" and ch["direction"] == 1), p.title
            lowered += ch["name"] == "MATRIX_LR" and ch["direction"] == -1
    assert lowered > 5, "the untried other direction is the natural next step"


def crash_of_cpu_depth_3(crashed_on: str | None = None) -> tuple[str, HistoryEntry]:
    crashed = TRAIN_PY.replace("CPU_DEPTH = 2", "CPU_DEPTH = 3")
    meta = {"changes": [{"name": "CPU_DEPTH", "old": 2, "new": 3, "direction": 1}]}
    if crashed_on is not None:
        meta["skeleton"] = crashed_on
    return crashed, entry(1, meta, "crash", None, crashed)


@pytest.mark.parametrize("seed", range(5))
def test_a_crash_blocks_its_value_and_beyond_while_the_code_is_the_same(seed):
    crashed, crash = crash_of_cpu_depth_3(skeleton(TRAIN_PY))
    ctx = ctx_for(history=[crash], seen_hashes={code_hash(crashed)}, feedback=["try a deeper model: cpu_depth up"])
    for p in run_loop(OfflineExplorer(seed), ctx, CRASH_MEMORY - 1):
        for ch in changes(p):
            assert not (ch["name"] == "CPU_DEPTH" and ch["new"] >= 3), p.title


def test_a_crash_blocks_for_crash_memory_experiments_then_the_value_is_tried_again():
    crashed, crash = crash_of_cpu_depth_3(skeleton(TRAIN_PY))
    filler = [
        entry(
            i,
            {"changes": [{"name": "MATRIX_LR", "old": 0.04, "new": 0.05, "direction": 1}]},
            "discard",
            0.01,
            f"filler {i}",
        )
        for i in range(2, CRASH_MEMORY + 2)
    ]
    feedback = ["try a deeper model: cpu_depth up"]
    blocked = OfflineExplorer(0).propose(ctx_for(history=[crash] + filler[:-1], feedback=feedback))
    assert not any(ch["name"] == "CPU_DEPTH" and ch["new"] >= 3 for ch in changes(blocked)), blocked.title
    retried = OfflineExplorer(0).propose(ctx_for(history=[crash] + filler, feedback=feedback))
    assert [(ch["name"], ch["new"]) for ch in changes(retried)] == [("CPU_DEPTH", 3)]
    assert f"more than {CRASH_MEMORY} experiments ago" in retried.hypothesis


def test_a_rejection_blocks_its_value_as_a_crash_does_and_is_told_with_its_reason():
    rejected_py, rejection = crash_of_cpu_depth_3(skeleton(TRAIN_PY))
    rejection = replace(rejection, status="rejected", error_tail="rejected: trained past the budget\nmore")
    feedback = ["try a deeper model: cpu_depth up"]
    ctx = ctx_for(history=[rejection], seen_hashes={code_hash(rejected_py)}, feedback=feedback)
    for p in run_loop(OfflineExplorer(0), ctx, 3):
        assert not any(ch["name"] == "CPU_DEPTH" and ch["new"] >= 3 for ch in changes(p)), p.title
    filler = [
        entry(i, {"changes": [{"name": "MATRIX_LR", "old": 0.04, "new": 0.05, "direction": 1}]}, "discard", 0.01)
        for i in range(2, CRASH_MEMORY + 2)
    ]
    retried = OfflineExplorer(0).propose(ctx_for(history=[rejection] + filler, feedback=feedback))
    assert [(ch["name"], ch["new"]) for ch in changes(retried)] == [("CPU_DEPTH", 3)]
    assert f"was rejected (trained past the budget) more than {CRASH_MEMORY} experiments ago" in retried.hypothesis


def test_a_crash_on_code_that_has_changed_since_does_not_block():
    # e.g. DEPTH 9 crashed on GPU while model_dim was not rounded to whole heads; train.py is fixed now
    crashed, crash = crash_of_cpu_depth_3(crashed_on="0123456789abcdef")
    p = OfflineExplorer(0).propose(
        ctx_for(history=[crash], seen_hashes={code_hash(crashed)}, feedback=["try a deeper model: cpu_depth up"])
    )
    assert [(ch["name"], ch["new"]) for ch in changes(p)] == [("CPU_DEPTH", 4)]  # 3 itself was seen
    assert "earlier version of train.py's code" in p.hypothesis


def test_a_crash_without_a_recorded_skeleton_blocks_for_a_while():
    crashed, crash = crash_of_cpu_depth_3()  # a record from before skeletons were kept
    ctx = ctx_for(history=[crash], seen_hashes={code_hash(crashed)}, feedback=["try a deeper model: cpu_depth up"])
    p = OfflineExplorer(0).propose(ctx)
    assert not any(ch["name"] == "CPU_DEPTH" and ch["new"] >= 3 for ch in changes(p)), p.title


def test_the_skeleton_ignores_constant_values_but_not_code():
    assert skeleton(set_constant(TRAIN_PY, "MATRIX_LR", "0.07")) == skeleton(TRAIN_PY)
    assert skeleton(set_constant(TRAIN_PY, "CPU_DEPTH", "5")) == skeleton(TRAIN_PY)
    assert skeleton(TRAIN_PY.replace("math.ceil(", "math.floor(")) != skeleton(TRAIN_PY)
    p = OfflineExplorer(0).propose(ctx_for())
    assert p.meta["skeleton"] == skeleton(TRAIN_PY) == skeleton(p.asset)


def test_combines_two_helpful_changes_after_a_losing_streak():
    main = TRAIN_PY.replace("MATRIX_LR = 0.04", "MATRIX_LR = 0.06").replace(
        "WARMDOWN_RATIO = 0.5", "WARMDOWN_RATIO = 0.6"
    )
    history = [
        entry(1, {"changes": [{"name": "MATRIX_LR", "old": 0.04, "new": 0.06, "direction": 1}]}, "keep", -0.02),
        entry(2, {"changes": [{"name": "WARMDOWN_RATIO", "old": 0.5, "new": 0.6, "direction": 1}]}, "keep", -0.01),
    ]
    ctx = ctx_for(main, history)
    proposals = run_loop(OfflineExplorer(0), ctx, 8)
    sizes = [len(changes(p)) for p in proposals]
    assert sizes.count(1) >= 6, "mostly one change at a time"
    combo = next(p for p in proposals if len(changes(p)) == 2)
    assert {ch["name"] for ch in changes(combo)} == {"MATRIX_LR", "WARMDOWN_RATIO"}
    assert all(ch["direction"] == 1 for ch in changes(combo))
    assert len(changed_lines(main, combo.asset)) == 2
    compile(combo.asset, "train.py", "exec")


# ---------------------------------------------------------------------------------------------
# Model shape and batch
# ---------------------------------------------------------------------------------------------


def test_the_fixture_holds_train_pys_constants_block():
    real = find_constants((Path(__file__).resolve().parents[3] / "train.py").read_text())
    ours = find_constants(TRAIN_PY)
    block = {n for n in ours if n != "SOME_OTHER_LR"}
    assert {n: real[n].source for n in block if n in real} == {n: ours[n].source for n in block}
    assert {n for n in real if n in KNOB_BY_NAME} == {n for n in ours if n in KNOB_BY_NAME}


def test_depth_9_and_beyond_is_reachable_on_cuda():
    p = OfflineExplorer(0).propose(ctx_for(device_kind="cuda", feedback=["make the model deeper: more depth"]))
    assert [(ch["name"], ch["new"]) for ch in changes(p)] == [("DEPTH", 9)]
    nine = p.asset
    history = [entry(1, p, "keep", -0.01)]
    deeper = 0
    for seed in range(10):
        q = OfflineExplorer(seed).propose(ctx_for(nine, history, device_kind="cuda", seen_hashes={code_hash(TRAIN_PY)}))
        deeper += any(ch["name"] == "DEPTH" and ch["new"] >= 10 for ch in changes(q))
    assert deeper > 5, "a kept DEPTH 9 is pushed further"


def splits(p: Proposal, ctx: ProposalContext) -> bool:
    """What train.py demands: TOTAL_BATCH_SIZE a positive multiple of DEVICE_BATCH_SIZE * seq_len."""
    prefix = "CPU_" if ctx.device_kind == "cpu" else ""
    consts = find_constants(p.asset)
    total, device = consts[f"{prefix}TOTAL_BATCH_SIZE"].value, consts[f"{prefix}DEVICE_BATCH_SIZE"].value
    per_pass = device * get_profile(ctx.profile).seq_len
    return total >= per_pass and total % per_pass == 0


def test_batch_splits_reads_the_live_constants():
    values = {"CPU_TOTAL_BATCH_SIZE": 2**12, "CPU_DEVICE_BATCH_SIZE": 32, "TOTAL_BATCH_SIZE": 1, "DEVICE_BATCH_SIZE": 1}
    assert batch_splits(values, "cpu", 128) and not batch_splits(values, "cpu", 256)
    assert not batch_splits(values, "cuda", 2048)
    assert batch_splits({}, "cpu", 256) and batch_splits(values, "cpu", None)  # nothing to check


@pytest.mark.parametrize("profile", ["cpu", "smoke", "h100"])
@pytest.mark.parametrize("seed", range(4))
def test_no_proposal_breaks_the_batch_into_partial_passes(profile, seed):
    device_kind = "cuda" if profile == "h100" else "cpu"
    prefix = "" if device_kind == "cuda" else "CPU_"
    pushes = [
        f"use a smaller {prefix}total_batch_size",
        f"try a bigger {prefix}device_batch_size",
        f"try a bigger {prefix}total_batch_size",
        f"use a smaller {prefix}device_batch_size",
    ]
    ctx = ctx_for(device_kind=device_kind, profile=profile)
    explorer, batch_moves = OfflineExplorer(seed), 0
    # 30 proposals, 24 to 29 of them batch moves for these seeds: the feedback grows with each, and
    # the explorer reads all of it, so every proposal more costs more than the last
    for i in range(30):
        ctx.feedback.append(pushes[(seed + i) % len(pushes)])  # a human who keeps asking for batch changes
        p = explorer.propose(ctx)
        assert splits(p, ctx), p.title
        ctx.seen_hashes.add(code_hash(p.asset))
        ctx.history.append(entry(len(ctx.history) + 1, p, "keep", -0.001))
        ctx.asset = p.asset  # every proposal is kept: the batch constants wander far
        batch_moves += any("BATCH" in ch["name"] for ch in changes(p))
    assert batch_moves >= 20


def test_lowering_the_total_batch_takes_the_micro_batch_down():
    ctx = ctx_for(feedback=["the batch is too big, use a smaller cpu_total_batch_size"])  # cpu: 16 x 256 = 2**12
    p = OfflineExplorer(0).propose(ctx)
    assert changed_lines(TRAIN_PY, p.asset) == [
        ("CPU_TOTAL_BATCH_SIZE = 2**12", "CPU_TOTAL_BATCH_SIZE = 2**11"),
        ("CPU_DEVICE_BATCH_SIZE = 16", "CPU_DEVICE_BATCH_SIZE = 8"),
    ]
    assert p.title == "Lower CPU_TOTAL_BATCH_SIZE 2**12 -> 2**11 (CPU_DEVICE_BATCH_SIZE 16 -> 8)"
    (ch,) = changes(p)
    assert ch["name"] == "CPU_TOTAL_BATCH_SIZE"
    assert ch["with"] == [{"name": "CPU_DEVICE_BATCH_SIZE", "old": 16, "new": 8}]
    assert "whole number of forward passes of 256-token sequences" in p.hypothesis
    # on smoke (seq_len 128) 2**11 is still one pass of 16 sequences: nothing else moves
    q = OfflineExplorer(0).propose(ctx_for(profile="smoke", feedback=ctx.feedback))
    assert changed_lines(TRAIN_PY, q.asset) == [("CPU_TOTAL_BATCH_SIZE = 2**12", "CPU_TOTAL_BATCH_SIZE = 2**11")]


@pytest.mark.parametrize("profile, allowed", [("cpu", False), ("smoke", True)])
def test_a_micro_batch_bigger_than_the_batch_is_never_proposed(profile, allowed):
    p = OfflineExplorer(0).propose(ctx_for(profile=profile, feedback=["try a bigger cpu_device_batch_size"]))
    raised = any(ch["name"] == "CPU_DEVICE_BATCH_SIZE" and ch["new"] > 16 for ch in changes(p))
    assert raised == allowed, p.title  # 32 x 256 > 2**12 on cpu; 32 x 128 = 2**12 on smoke


def test_a_main_that_does_not_split_its_batch_is_a_clear_error():
    broken = set_constant(TRAIN_PY, "CPU_TOTAL_BATCH_SIZE", "2**11")
    with pytest.raises(
        AgentStopped,
        match=r"CPU_TOTAL_BATCH_SIZE = 2\*\*11 is not a positive multiple of "
        r"CPU_DEVICE_BATCH_SIZE \* seq_len = 16 \* 256 \(profile cpu\)",
    ):
        OfflineExplorer(0).propose(ctx_for(broken))
    assert OfflineExplorer(0).propose(ctx_for(broken, profile="smoke")).meta["changes"]


# ---------------------------------------------------------------------------------------------
# Human feedback
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_feedback_names_parameter_and_direction(seed):
    comment = "please try a lower warmdown_ratio"
    p = OfflineExplorer(seed).propose(ctx_for(feedback=[comment]))
    (ch,) = changes(p)
    assert ch["name"] == "WARMDOWN_RATIO" and ch["new"] < 0.5
    assert "human" in p.hypothesis and comment in p.hypothesis
    assert p.meta["feedback"] == comment


@pytest.mark.parametrize(
    "comment, name, direction",
    [
        ("MATRIX_LR up", "MATRIX_LR", 1),
        ("Matrix LR down please", "MATRIX_LR", -1),
        ("increase the embedding_lr", "EMBEDDING_LR", 1),
        ("the batch is too big, use a smaller cpu_total_batch_size", "CPU_TOTAL_BATCH_SIZE", -1),
    ],
)
def test_feedback_variants(comment, name, direction):
    p = OfflineExplorer(0).propose(ctx_for(feedback=[comment]))
    (ch,) = changes(p)
    assert (ch["name"], ch["direction"]) == (name, direction)


def test_feedback_already_followed_is_not_forced_again():
    comment = "please try a lower warmdown_ratio"
    first = OfflineExplorer(0).propose(ctx_for(feedback=[comment]))
    history = [entry(1, first, "discard", 0.01)]
    second = OfflineExplorer(0).propose(
        ctx_for(history=history, feedback=[comment], seen_hashes={code_hash(first.asset)})
    )
    assert "feedback" not in second.meta


def test_negative_feedback_steers_away():
    free = OfflineExplorer(1).propose(ctx_for())
    name = changes(free)[0]["name"]
    steered = OfflineExplorer(1).propose(ctx_for(feedback=[f"don't touch {name.lower()}"]))
    assert changes(steered)[0]["name"] != name


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_exhaustion_raises():
    only = 'WINDOW_PATTERN = "SSSL"      # per layer\nprint(WINDOW_PATTERN)\n'
    seen = {code_hash(only.replace('"SSSL"', f'"{c}"')) for c in ("L", "SL", "SSL", "SSSSL")}
    with pytest.raises(AgentStopped, match="explorer exhausted"):
        OfflineExplorer(0).propose(ctx_for(only, seen_hashes=seen))


def test_exhaustion_after_a_loop():
    only = 'WINDOW_PATTERN = "SSSL"\nprint(WINDOW_PATTERN)\n'
    ctx = ctx_for(only)
    proposals = run_loop(OfflineExplorer(0), ctx, 3)
    assert {changes(p)[0]["new"] for p in proposals} == {"SSL", "SL", "SSSSL"}
    with pytest.raises(AgentStopped, match="explorer exhausted"):
        OfflineExplorer(0).propose(ctx)


@pytest.mark.parametrize(
    "text",
    [
        "import torch\nprint('no constants here')\n",
        "def f():\n    MATRIX_LR = 0.04\n    return MATRIX_LR\n",  # not module level
        "LR = compute()\n",
    ],
)
def test_train_py_without_the_block_raises_a_clear_error(text):
    with pytest.raises(AgentStopped, match="no tunable constant") as err:
        OfflineExplorer(0).propose(ctx_for(text))
    assert "MATRIX_LR = 0.04" in str(err.value)  # shows what the block must look like


def test_cpu_block_on_cuda_has_nothing_live():
    cpu_only = "CPU_DEPTH = 2\nCPU_HEAD_DIM = 32\n"
    assert OfflineExplorer(0).propose(ctx_for(cpu_only, device_kind="cpu")).meta["changes"]
    with pytest.raises(AgentStopped, match="no tunable constant"):
        OfflineExplorer(0).propose(ctx_for(cpu_only, device_kind="cuda"))


def test_find_constants_reads_literals_and_spans():
    consts = find_constants(TRAIN_PY + "NEG = -3e-4\nTWICE = 1\nTWICE = 2\n")
    assert consts["TOTAL_BATCH_SIZE"].value == 2**19 and consts["TOTAL_BATCH_SIZE"].pow2
    assert consts["TOTAL_BATCH_SIZE"].source == "2**19"
    assert consts["WINDOW_PATTERN"].value == "SSSL" and consts["WINDOW_PATTERN"].source == '"SSSL"'
    assert consts["NEG"].value == -3e-4
    assert "TWICE" not in consts  # assigned twice: ambiguous, left alone


# --- other tasks: router.py's constants (query.sql's indexes: test_indexes.py) -------------------

ROUTER_PY = (Path(__file__).resolve().parents[3] / "runner" / "tasks" / "ticket_routing" / "router.py").read_text()


def test_on_router_py_the_explorer_moves_its_constants_flags_included_and_names_accuracy() -> None:
    ctx = ctx_for(ROUTER_PY, task="ticket-routing", seen_hashes={code_hash(ROUTER_PY)})
    proposals = run_loop(OfflineExplorer(seed=3), ctx, 6)
    moved = [(c["name"], c["old"], c["new"]) for p in proposals for c in changes(p)]
    assert {name for name, _, _ in moved} <= {"ALPHA", "BIGRAMS", "MIN_WORD_LENGTH", "PRIOR", "LOWERCASE"}
    assert ("BIGRAMS", False, True) in moved and ("PRIOR", True, False) in moved
    for p in proposals:
        (change,) = changes(p)
        assert len(changed_lines(ROUTER_PY, p.asset)) == 1 and p.asset != ROUTER_PY
        assert "any difference in accuracy can be attributed" in p.hypothesis and "val_bpb" not in p.hypothesis
    flag = next(p for p in proposals if changes(p)[0]["name"] == "BIGRAMS")
    assert flag.title == "Switch on BIGRAMS False -> True" and "BIGRAMS = True" in flag.asset


def test_on_router_py_the_same_seed_proposes_the_same_and_history_is_told_in_accuracy() -> None:
    def first(seed: int, **kw) -> Proposal:
        return OfflineExplorer(seed).propose(ctx_for(ROUTER_PY, task="ticket-routing", **kw))

    assert first(1).asset == first(1).asset
    assert len({first(seed).title for seed in range(8)}) > 1  # the seed's jitter orders the untried arms
    raised = {"changes": [{"name": "ALPHA", "old": 1.0, "new": 2.0, "direction": 1}]}
    p = first(0, history=[entry(1, raised, "discard", 0.004)], feedback=["try a higher alpha"])
    assert p.title == "Raise ALPHA 1.0 -> 1.4"  # a smaller step after a step that hurt
    # the loop keeps the loss (-accuracy): a loss 0.004 higher is accuracy 0.004 lower
    assert "The last increase of ALPHA (1.0 -> 2.0) did not help (-0.0040 accuracy)" in p.hypothesis
