"""The offline explorer: one-line edits of train.py's constants, chosen by a bandit that learns."""

from __future__ import annotations


import pytest

from bot.agent import Agent, AgentError
from bot.agent.explorer import KNOB_BY_NAME, OfflineExplorer, find_constants
from bot.records import HistoryEntry, Proposal, ProposalContext, code_hash

TRAIN_PY = '''"""A tiny GPT training script (test fixture)."""
import math

# ---------------------------------------------------------------------------
# Hyperparameters: the agent's main knobs
# ---------------------------------------------------------------------------
# Model shape and batch on a GPU (profile h100)
DEPTH = 8                    # transformer layers
ASPECT_RATIO = 64            # model_dim = DEPTH * ASPECT_RATIO
HEAD_DIM = 128               # attention head size
TOTAL_BATCH_SIZE = 2**19     # tokens per optimizer step
DEVICE_BATCH_SIZE = 128      # sequences per forward pass
# Model shape and batch on the CPU (profiles cpu, smoke)
CPU_DEPTH = 2
CPU_ASPECT_RATIO = 64
CPU_HEAD_DIM = 32
CPU_TOTAL_BATCH_SIZE = 2**12
CPU_DEVICE_BATCH_SIZE = 16
# Attention
WINDOW_PATTERN = "SSSL"      # per layer, cycled: S = half context, L = full context
LOGIT_SOFTCAP = 15.0
# Optimization
EMBEDDING_LR = 0.6
UNEMBEDDING_LR = 0.004
MATRIX_LR = 0.04
SCALAR_LR = 0.5
WEIGHT_DECAY = 0.2
ADAM_BETA1 = 0.8
ADAM_BETA2 = 0.95
MUON_MOMENTUM = 0.95
WARMUP_RATIO = 0.0
WARMDOWN_RATIO = 0.5
FINAL_LR_FRAC = 0.0
SOME_OTHER_LR = 0.1          # not in the explorer's table: never touched


def model_dim(depth: int, aspect: int) -> int:
    return depth * aspect


def lr_at(progress: float) -> float:
    if progress < WARMUP_RATIO:
        return MATRIX_LR * progress / max(WARMUP_RATIO, 1e-9)
    if progress > 1 - WARMDOWN_RATIO:
        frac = (1 - progress) / WARMDOWN_RATIO
        return MATRIX_LR * (frac + (1 - frac) * FINAL_LR_FRAC)
    return MATRIX_LR


if __name__ == "__main__":
    print(model_dim(DEPTH, ASPECT_RATIO), TOTAL_BATCH_SIZE // DEVICE_BATCH_SIZE, WINDOW_PATTERN, lr_at(0.9))
'''

GPU_SIZES = {"DEPTH", "ASPECT_RATIO", "HEAD_DIM", "TOTAL_BATCH_SIZE", "DEVICE_BATCH_SIZE"}
CPU_SIZES = {f"CPU_{n}" for n in GPU_SIZES}


def ctx_for(train_py: str = TRAIN_PY, history=None, device_kind: str = "cpu", **kw) -> ProposalContext:
    return ProposalContext(
        program_md="Lower val_bpb.",
        train_py=train_py,
        main_val_bpb=1.0,
        history=list(history or []),
        device_kind=device_kind,
        profile="cpu" if device_kind == "cpu" else "h100",
        **kw,
    )


def changed_lines(old: str, new: str) -> list[tuple[str, str]]:
    """(old line, new line) for every line that differs; both texts must have the same line count."""
    a, b = old.splitlines(), new.splitlines()
    assert len(a) == len(b)
    return [(x, y) for x, y in zip(a, b) if x != y]


def changes(p: Proposal) -> list[dict]:
    return p.meta["changes"]


def entry(i: int, p_or_meta, status: str, delta: float | None, train_py: str = "") -> HistoryEntry:
    meta = p_or_meta.meta if isinstance(p_or_meta, Proposal) else p_or_meta
    text = p_or_meta.train_py if isinstance(p_or_meta, Proposal) else train_py
    return HistoryEntry(
        id=i, title=f"exp {i}", hypothesis="", status=status,
        val_bpb=None if delta is None else 1.0 + delta, delta=delta,
        code_hash=code_hash(text or f"exp {i}"), meta=meta,
    )


def run_loop(explorer: OfflineExplorer, ctx: ProposalContext, n: int, status: str = "discard",
             delta: float | None = 0.01) -> list[Proposal]:
    """Propose n times, feeding each proposal back as a finished experiment."""
    out = []
    for _ in range(n):
        p = explorer.propose(ctx)
        out.append(p)
        ctx.seen_hashes.add(code_hash(p.train_py))
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


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
@pytest.mark.parametrize("seed", range(6))
def test_proposal_changes_exactly_one_constant(seed, device_kind):
    p = OfflineExplorer(seed).propose(ctx_for(device_kind=device_kind))
    diff = changed_lines(TRAIN_PY, p.train_py)
    assert len(diff) == 1, diff
    (old_line, new_line), = diff
    # Same name, same comment: only the value's span changed.
    name = old_line.split("=")[0].strip()
    assert new_line.startswith(old_line.split("=")[0] + "=")
    if "#" in old_line:
        assert new_line[new_line.index("#"):] == old_line[old_line.index("#"):]
    compile(p.train_py, "train.py", "exec")
    (change,) = changes(p)
    assert change["name"] == name
    new_value = find_constants(p.train_py)[name].value
    assert new_value == change["new"] != change["old"] == find_constants(TRAIN_PY)[name].value
    assert change["direction"] in (1, -1)
    assert in_bounds(name, new_value)
    assert p.title and len(p.title) < 80 and name in p.title
    assert name in p.hypothesis and len(p.hypothesis) > 80


def test_every_line_but_one_is_byte_identical_including_crlf():
    crlf = TRAIN_PY.replace("\n", "\r\n")
    p = OfflineExplorer(0).propose(ctx_for(crlf))
    old, new = crlf.splitlines(keepends=True), p.train_py.splitlines(keepends=True)
    assert len(old) == len(new)
    assert sum(a != b for a, b in zip(old, new)) == 1
    assert all(line.endswith("\r\n") for line in new)


def test_powers_of_two_are_written_back_as_powers():
    ctx = ctx_for(feedback=["try a higher cpu_total_batch_size"])
    p = OfflineExplorer(0).propose(ctx)
    assert changed_lines(TRAIN_PY, p.train_py) == [("CPU_TOTAL_BATCH_SIZE = 2**12", "CPU_TOTAL_BATCH_SIZE = 2**13")]
    assert p.title == "Raise CPU_TOTAL_BATCH_SIZE 2**12 -> 2**13"


@pytest.mark.parametrize("seed", range(3))
def test_many_proposals_stay_in_bounds_and_compile(seed):
    ctx = ctx_for()
    for p in run_loop(OfflineExplorer(seed), ctx, 60):
        compile(p.train_py, "train.py", "exec")
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
    allowed = (CPU_SIZES if device_kind == "cpu" else GPU_SIZES)
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
    assert (a.title, a.hypothesis, a.train_py, a.meta) == (b.title, b.hypothesis, b.train_py, b.meta)


def test_different_seeds_can_differ():
    titles = {OfflineExplorer(seed).propose(ctx_for()).title for seed in range(10)}
    assert len(titles) > 1


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_never_repeats_a_train_py(device_kind):
    ctx = ctx_for(device_kind=device_kind)
    main_hash = code_hash(TRAIN_PY)
    proposals = run_loop(OfflineExplorer(0), ctx, 40)
    hashes = [code_hash(p.train_py) for p in proposals]
    assert len(set(hashes)) == 40
    assert main_hash not in hashes


def test_skips_a_candidate_already_seen():
    first = OfflineExplorer(0).propose(ctx_for())
    second = OfflineExplorer(0).propose(ctx_for(seen_hashes={code_hash(first.train_py)}))
    assert code_hash(second.train_py) != code_hash(first.train_py)


# ---------------------------------------------------------------------------------------------
# Learning from history
# ---------------------------------------------------------------------------------------------


def test_pushes_further_in_a_direction_that_was_kept():
    kept_main = TRAIN_PY.replace("MATRIX_LR = 0.04", "MATRIX_LR = 0.06")
    history = [entry(1, {"changes": [{"name": "MATRIX_LR", "old": 0.04, "new": 0.06, "direction": 1}]},
                     "keep", -0.02, kept_main)]
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
    history = [entry(1, {"changes": [{"name": "MATRIX_LR", "old": 0.04, "new": 0.06, "direction": 1}]},
                     "discard", +0.015, hurt)]
    lowered = 0
    for seed in range(10):
        p = OfflineExplorer(seed).propose(ctx_for(history=history, seen_hashes={code_hash(hurt)}))
        for ch in changes(p):
            assert not (ch["name"] == "MATRIX_LR" and ch["direction"] == 1), p.title
            lowered += ch["name"] == "MATRIX_LR" and ch["direction"] == -1
    assert lowered > 5, "the untried other direction is the natural next step"


@pytest.mark.parametrize("seed", range(5))
def test_a_crash_is_not_retried_in_the_same_direction(seed):
    crashed = TRAIN_PY.replace("CPU_DEPTH = 2", "CPU_DEPTH = 3")
    history = [entry(1, {"changes": [{"name": "CPU_DEPTH", "old": 2, "new": 3, "direction": 1}]},
                     "crash", None, crashed)]
    ctx = ctx_for(history=history, seen_hashes={code_hash(crashed)}, feedback=["try a deeper model: cpu_depth up"])
    for p in run_loop(OfflineExplorer(seed), ctx, 40):
        for ch in changes(p):
            assert not (ch["name"] == "CPU_DEPTH" and ch["new"] >= 3), p.title


def test_combines_two_helpful_changes_after_a_losing_streak():
    main = TRAIN_PY.replace("MATRIX_LR = 0.04", "MATRIX_LR = 0.06").replace("WARMDOWN_RATIO = 0.5", "WARMDOWN_RATIO = 0.6")
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
    assert len(changed_lines(main, combo.train_py)) == 2
    compile(combo.train_py, "train.py", "exec")


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


@pytest.mark.parametrize("comment, name, direction", [
    ("MATRIX_LR up", "MATRIX_LR", 1),
    ("Matrix LR down please", "MATRIX_LR", -1),
    ("increase the embedding_lr", "EMBEDDING_LR", 1),
    ("the batch is too big, use a smaller cpu_total_batch_size", "CPU_TOTAL_BATCH_SIZE", -1),
])
def test_feedback_variants(comment, name, direction):
    p = OfflineExplorer(0).propose(ctx_for(feedback=[comment]))
    (ch,) = changes(p)
    assert (ch["name"], ch["direction"]) == (name, direction)


def test_feedback_already_followed_is_not_forced_again():
    comment = "please try a lower warmdown_ratio"
    first = OfflineExplorer(0).propose(ctx_for(feedback=[comment]))
    history = [entry(1, first, "discard", 0.01)]
    second = OfflineExplorer(0).propose(
        ctx_for(history=history, feedback=[comment], seen_hashes={code_hash(first.train_py)}))
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
    with pytest.raises(AgentError, match="explorer exhausted"):
        OfflineExplorer(0).propose(ctx_for(only, seen_hashes=seen))


def test_exhaustion_after_a_loop():
    only = 'WINDOW_PATTERN = "SSSL"\nprint(WINDOW_PATTERN)\n'
    ctx = ctx_for(only)
    proposals = run_loop(OfflineExplorer(0), ctx, 3)
    assert {changes(p)[0]["new"] for p in proposals} == {"SSL", "SL", "SSSSL"}
    with pytest.raises(AgentError, match="explorer exhausted"):
        OfflineExplorer(0).propose(ctx)


@pytest.mark.parametrize("text", [
    "import torch\nprint('no constants here')\n",
    "def f():\n    MATRIX_LR = 0.04\n    return MATRIX_LR\n",  # not module level
    "LR = compute()\n",
])
def test_train_py_without_the_block_raises_a_clear_error(text):
    with pytest.raises(AgentError, match="no tunable constant") as err:
        OfflineExplorer(0).propose(ctx_for(text))
    assert "MATRIX_LR = 0.04" in str(err.value)  # shows what the block must look like


def test_cpu_block_on_cuda_has_nothing_live():
    cpu_only = "CPU_DEPTH = 2\nCPU_HEAD_DIM = 32\n"
    assert OfflineExplorer(0).propose(ctx_for(cpu_only, device_kind="cpu")).meta["changes"]
    with pytest.raises(AgentError, match="no tunable constant"):
        OfflineExplorer(0).propose(ctx_for(cpu_only, device_kind="cuda"))


def test_find_constants_reads_literals_and_spans():
    consts = find_constants(TRAIN_PY + "NEG = -3e-4\nTWICE = 1\nTWICE = 2\n")
    assert consts["TOTAL_BATCH_SIZE"].value == 2**19 and consts["TOTAL_BATCH_SIZE"].pow2
    assert consts["TOTAL_BATCH_SIZE"].source == "2**19"
    assert consts["WINDOW_PATTERN"].value == "SSSL" and consts["WINDOW_PATTERN"].source == '"SSSL"'
    assert consts["NEG"].value == -3e-4
    assert "TWICE" not in consts  # assigned twice: ambiguous, left alone
