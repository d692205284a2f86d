"""The offline explorer: a small, explainable bandit search over the tunable constants of an asset.

No network and no model: it edits the module-level constants of the task's asset (train.py's
``MATRIX_LR = 0.04``, ``DEPTH = 8`` ...; router.py's ``ALPHA = 1.0``, ``BIGRAMS = False`` ...) one
at a time and learns from the outcomes of its own earlier edits. A SQL asset has no constants:
for query.sql it makes one edit of its indexes at a time (bot.agent.indexes: an index on a
filtered table with the join indexes a plan starting there needs, a composite, ANALYZE, a drop).

How it works
------------
* ``knobs.TASK_KNOBS`` lists, per task, every constant it may tune, with a kind (log-scale float,
  linear ratio, beta, int, power of two, multiple of 16, choice, flag) and bounds. Only names that
  exist in the asset are tuned, and for train.py only the size constants that are live on
  ``ctx.device_kind`` (``CPU_*`` on "cpu", the GPU ones on "cuda"); attention and optimizer
  constants are shared.
* Every (constant, direction) pair is an arm of a UCB bandit. Each earlier experiment whose
  ``meta["changes"]`` names the arm is an outcome: keep +1, discard that hurt -1, discard that
  improved but not enough to keep +0.25, crash -1. Outcomes of the opposite direction count half,
  mirrored (lowering hurt -> raising looks promising). Recent outcomes weigh more. The score is
  ``mean + C * sqrt(ln(N + 1) / (n + 1))`` plus a small per-knob prior and a seeded jitter, so
  untried arms get explored and arms that helped get pushed further.
* A crash blocks the crashed value and anything beyond it in that direction, but not forever: a
  crash can come from a bug that is fixed later (train.py once crashed at any model width that was
  not a whole number of heads). The block holds while the code around the constants is the code
  that crashed (each proposal records a hash of the asset with the tuned values blanked out, its
  "skeleton") and for at most ``CRASH_MEMORY`` later experiments; after that the value may be
  tried once more, and a new crash blocks it again. A crash on a different skeleton says nothing
  about today's code and is not scored at all.
* train.py's batch must split into whole forward passes: ``TOTAL_BATCH_SIZE`` a positive multiple of
  ``DEVICE_BATCH_SIZE * seq_len``, with seq_len from ``ctx.profile`` (train.py fails at once
  otherwise). No proposal breaks that. Lowering the total batch below one pass of the current
  micro-batch takes the micro-batch down with it, in the same proposal, so smaller batches stay
  reachable.
* The step size follows the arm's last outcome: after a keep a bigger step in the same direction,
  after a discard a smaller one, otherwise the normal step.
* Human feedback naming a constant ("try a lower matrix_lr") gives that arm a large bonus until
  an experiment has followed that comment.
* Mostly one change per proposal; during a losing streak it occasionally combines the two best
  arms that helped earlier.
* Proposals whose code_hash was already seen (or equals main) are skipped in favour of the next
  candidate; when nothing is left it raises ``AgentStopped("explorer exhausted: ...")``.
* Several questions may be open at once (bot.loop.agent_worker), each with a context that cannot
  know what the others will propose. The explorer answers them one after the other and never hands
  out the same asset twice: each answer's code_hash is reserved, and the next question skips it as
  if it had been seen, so two questions asked at once take the best and the second-best move. A
  reservation lasts as long as the explorer (an answer abandoned at its time limit is not handed out
  again either); a conductor started afresh reads what was proposed from the store.

Where it lives
--------------
This module holds the search policy and ``OfflineExplorer.propose``; the parts it draws on are
``knobs`` (the tables of knobs and how a value steps), ``constants`` (finding and editing an
asset's constants), ``batch`` (whole forward passes per profile), ``crash_memory`` (how long a crash
blocks), ``arms`` (the arms and learning from history), ``feedback`` (human comments) and
``writeup`` (titles and hypotheses); ``indexes`` is its policy for query.sql, reading the query
with ``sql_columns``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import threading
from typing import Any

from bot.agent.arms import Arm, learn
from bot.agent.batch import batch_followers, batch_names, batch_splits, profile_seq_len
from bot.agent.constants import Constant, apply_edits, compiles, find_constants, format_value
from bot.agent.crash_memory import CRASH_MEMORY, skeleton
from bot.agent.feedback import apply_feedback
from bot.agent.indexes import propose_index
from bot.agent.knobs import Knob, knob_table, live, usable
from bot.agent.writeup import describe, rationale, what_helped
from bot.core.protocols import AgentStopped
from bot.core.records import HistoryEntry, Proposal, ProposalContext, code_hash
from bot.core.states import NO_NUMBER
from runner.tasks import DEFAULT_TASK, Task, get_task

JITTER = 0.1  # seeded noise added to every arm's score (tie-breaking among untried arms)
COMBINE_AFTER = 4  # consecutive non-keeps before the first combined proposal...
COMBINE_EVERY = 3  # ...and then every this many


def _block_help(task: Task, table: dict[str, Knob], device_kind: str) -> str:
    names = [k.name for k in table.values() if live(k, device_kind)]
    if task.name != DEFAULT_TASK:
        return (
            f"{task.asset} needs module-level constants, one plain assignment of a literal per line "
            f"(for example `ALPHA = 1.0`, `BIGRAMS = False`). The explorer tunes these names: {', '.join(names)}."
        )
    return (
        "train.py needs a block of module-level hyperparameter constants, one plain assignment of a "
        "literal per line, for example:\n\n"
        "    DEPTH = 8                    # transformer layers\n"
        "    CPU_DEPTH = 2\n"
        "    MATRIX_LR = 0.04\n"
        "    TOTAL_BATCH_SIZE = 2**19\n"
        '    WINDOW_PATTERN = "SSSL"\n\n'
        f"The explorer tunes these names on device_kind {device_kind!r}: {', '.join(names)}."
    )


def tunes(task: str) -> bool:
    """Whether the explorer has something to tune in the task's asset: a table of its constants
    (knobs.TASK_KNOBS), or the indexes of a SQL asset."""
    spec = get_task(task)
    return spec.asset.endswith(".sql") or bool(knob_table(spec.name))


class OfflineExplorer:
    """Deterministic UCB bandit over (constant, direction) arms of the asset's constants (index arms
    for query.sql: bot.agent.indexes)."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._lock = threading.Lock()  # one question at a time, whatever the threads asking
        self._handed_out: set[str] = set()  # code_hash of every asset it proposed

    # The public entry point --------------------------------------------------------------------

    def propose(self, ctx: ProposalContext) -> Proposal:
        """The best move not yet seen nor handed out to another question."""
        with self._lock:
            if not self._handed_out <= ctx.seen_hashes:
                ctx = dataclasses.replace(ctx, seen_hashes=ctx.seen_hashes | self._handed_out)
            proposal = self._propose(ctx)
            self._handed_out.add(code_hash(proposal.asset))
            return proposal

    def _propose(self, ctx: ProposalContext) -> Proposal:
        task = get_task(ctx.task)
        if task.asset.endswith(".sql"):
            return propose_index(ctx, task, self.seed)
        table = knob_table(task.name)
        if not table:
            raise AgentStopped(
                f"the offline explorer knows no tunable constants of the {task.name} task's {task.asset}: "
                "edit it by hand, or configure an LLM agent"
            )
        consts = find_constants(ctx.asset)
        knobs = [
            k
            for k in table.values()
            if live(k, ctx.device_kind) and k.name in consts and usable(k, consts[k.name].value)
        ]
        if not knobs:
            raise AgentStopped(
                f"explorer found no tunable constant in {task.asset}. " + _block_help(task, table, ctx.device_kind)
            )
        seq_len = profile_seq_len(ctx.profile) if task.name == DEFAULT_TASK else None  # train.py's batch only
        if task.name == DEFAULT_TASK and not batch_splits(
            {n: c.value for n, c in consts.items()}, ctx.device_kind, seq_len
        ):
            total_name, device_name = batch_names(ctx.device_kind)
            raise AgentStopped(
                f"train.py on main does not split its batch into whole forward passes: {total_name} = "
                f"{consts[total_name].source} is not a positive multiple of {device_name} * seq_len = "
                f"{consts[device_name].source} * {seq_len} (profile {ctx.profile}), so every run of it crashes. "
                f"Set {total_name} to a multiple of {device_name} * {seq_len} on main first."
            )

        main_hash = code_hash(ctx.asset)
        rng = random.Random(self._rng_seed(ctx, main_hash))
        arms: dict[tuple[str, int], Arm] = {}
        for k in knobs:
            for d in (1, -1):
                arms[(k.name, d)] = Arm(knob=k, const=consts[k.name], direction=d, jitter=rng.random() * JITTER)
        shape = skeleton(ctx.asset, table)
        learn(arms, ctx.history, shape, table)
        apply_feedback(arms, ctx.feedback, ctx.history)
        ranked = sorted(arms.values(), key=lambda a: (-a.score, a.knob.name, -a.direction))

        if self._losing_streak(ctx.history):
            combo = self._combine(ctx, task, ranked, consts, seq_len, shape)
            if combo is not None:
                return combo

        tried = 0
        for arm in ranked:
            for size, new in arm.candidates():
                tried += 1
                made = self._edit(ctx, consts, seq_len, [(arm, new)])
                if made is None:
                    continue
                text, (new_src,), followed = made
                title, body, change = describe(arm, size, new, new_src, task)
                meta: dict[str, Any] = {"changes": [change], "skeleton": shape, "explorer": self._explain(arm)}
                if arm.feedback > 0 and arm.feedback_line:
                    body += f' This follows the human\'s comment: "{arm.feedback_line.strip()}".'
                    meta["feedback"] = arm.feedback_line
                if followed:
                    (f,) = followed
                    title += f" ({f['name']} {f['old_src']} -> {f['new_src']})"
                    body += (
                        f" {f['name']} moves with it ({f['old_src']} -> {f['new_src']}), so that a step is "
                        f"still a whole number of forward passes of {seq_len}-token sequences; that only "
                        f"changes how the step is computed, so any difference in {task.metric.name} can be "
                        "attributed to the batch size."
                    )
                    change["with"] = [{k: v for k, v in f.items() if k in ("name", "old", "new")}]
                else:
                    body += (
                        f" Nothing else changes, so any difference in {task.metric.name} can be attributed to this "
                        "one constant."
                    )
                return Proposal(title=title, hypothesis=body, asset=text, meta=meta)

        batch = " would not split the batch into whole forward passes," if task.name == DEFAULT_TASK else ""
        raise AgentStopped(
            f"explorer exhausted: all {tried} nearby edits of the tunable constants "
            f"({', '.join(k.name for k in knobs)}) from the current main were already tried,{batch} or lie at or "
            f"beyond a crash of the last {CRASH_MEMORY} experiments. Edit {task.asset} by hand, widen the "
            "explorer's bounds, or configure an LLM agent."
        )

    # Internals ------------------------------------------------------------------------------------

    def _rng_seed(self, ctx: ProposalContext, main_hash: str) -> int:
        key = f"{self.seed}|{main_hash}|{len(ctx.history)}|{ctx.device_kind}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")

    def _explain(self, arm: Arm) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "arm": f"{arm.knob.name}{'+' if arm.direction > 0 else '-'}",
            "score": round(arm.score, 4),
            "mean": round(arm.q, 4),
            "bonus": round(arm.bonus, 4),
            "tries": len(arm.outcomes),
        }

    @staticmethod
    def _edit(
        ctx: ProposalContext, consts: dict[str, Constant], seq_len: int | None, moves: list[tuple[Arm, Any]]
    ) -> tuple[str, list[str], list[dict[str, Any]]] | None:
        """The asset with these moves (and the micro-batch that must follow them), the new values'
        sources and the followers; None when the result is main or was seen before, does not
        compile, or would not split its batch into whole forward passes."""
        sources = [format_value(arm.knob, arm.const, new) for arm, new in moves]
        edits = [(arm.const, src) for (arm, _), src in zip(moves, sources, strict=True)]
        values = {n: c.value for n, c in consts.items()} | {arm.knob.name: new for arm, new in moves}
        followed: list[dict[str, Any]] = []
        moved = {arm.knob.name for arm, _ in moves}
        for arm, new in moves:
            for const, knob, value in batch_followers(arm.knob, new, consts, ctx.device_kind, seq_len):
                if const.name in moved:
                    continue  # moved on purpose already; the batch check below decides
                src = format_value(knob, const, value)
                edits.append((const, src))
                values[const.name] = value
                followed.append(
                    {"name": const.name, "old": const.value, "new": value, "old_src": const.source, "new_src": src}
                )
        if not batch_splits(values, ctx.device_kind, seq_len):
            return None
        text = apply_edits(ctx.asset, edits)
        h = code_hash(text)
        if h == code_hash(ctx.asset) or h in ctx.seen_hashes or not compiles(text):
            return None
        return text, sources, followed

    @staticmethod
    def _streak(history: list[HistoryEntry]) -> int:
        """How many experiments in a row, most recent first, were discarded, crashed or rejected."""
        streak = 0
        for e in reversed(history):
            if e.status == "running":
                continue
            if e.status not in ("discard", *NO_NUMBER):
                break
            streak += 1
        return streak

    def _losing_streak(self, history: list[HistoryEntry]) -> bool:
        streak = self._streak(history)
        return streak >= COMBINE_AFTER and (streak - COMBINE_AFTER) % COMBINE_EVERY == 0

    def _combine(
        self,
        ctx: ProposalContext,
        task: Task,
        ranked: list[Arm],
        consts: dict[str, Constant],
        seq_len: int | None,
        shape: str,
    ) -> Proposal | None:
        """Two different constants, each moved in a direction that helped before, in one proposal."""
        helped = [a for a in ranked if a.feedback >= 0 and not a.crashes and any(o.reward > 0 for o in a.outcomes)]
        for i, a in enumerate(helped):
            for b in helped[i + 1 :]:
                if a.knob.name == b.knob.name:
                    continue
                ca, cb = a.candidates(), b.candidates()
                if not ca or not cb:
                    continue
                (sa, va), (sb, vb) = ca[0], cb[0]
                made = self._edit(ctx, consts, seq_len, [(a, va), (b, vb)])
                if made is None:
                    continue
                text, (src_a, src_b), followed = made
                ta, _, cha = describe(a, sa, va, src_a, task)
                tb, _, chb = describe(b, sb, vb, src_b, task)
                for ch in (cha, chb):  # only the total batch has followers
                    if followed and ch["name"] == batch_names(ctx.device_kind)[0]:
                        ch["with"] = [{k: v for k, v in f.items() if k in ("name", "old", "new")} for f in followed]
                lower = lambda s: s[0].lower() + s[1:]  # noqa: E731
                title = f"Combine: {lower(ta)}, {lower(tb)}"
                body = (
                    f"The last {self._streak(ctx.history)} experiments were all discarded, so this combines two "
                    f"directions that helped earlier: {what_helped(a, task.metric)} and {what_helped(b, task.metric)}. {rationale(a)} "
                    f"{rationale(b)} Moving both at once tests whether their gains add up; if it helps, later "
                    "single changes can tell which one mattered."
                )
                meta = {
                    "changes": [cha, chb],
                    "combined": True,
                    "skeleton": shape,
                    "explorer": {"seed": self.seed, "arms": [self._explain(a), self._explain(b)]},
                }
                return Proposal(title=title, hypothesis=body, asset=text, meta=meta)
        return None
