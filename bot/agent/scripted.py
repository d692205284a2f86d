"""The scripted agent: replays a fixed queue of proposals, skipping any already tried.

Useful for a human who wants specific experiments run in order (a JSON-lines file of
{"title", "hypothesis", "asset"} objects, where "asset" is the full text of the task's asset:
train.py, router.py, query.sql; "train_py" is the older name of the same key and still read), and for
tests that need known proposals. It takes one question at a time (`questions_at_once`), whatever
the slots: the queue is proposed in its order, each experiment getting the next proposal.
"""

from __future__ import annotations

import json
from pathlib import Path

from bot.core.protocols import AgentStopped
from bot.core.records import Proposal, ProposalContext, code_hash


class ScriptedAgent:
    questions_at_once = 1  # answers at once and in order: asked in parallel, the order would be the threads'

    def __init__(self, proposals: list[Proposal]) -> None:
        self.proposals = list(proposals)

    @classmethod
    def from_jsonl(cls, path: Path) -> ScriptedAgent:
        proposals = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                proposals.append(
                    Proposal(
                        title=item["title"],
                        hypothesis=item.get("hypothesis", ""),
                        asset=item["asset"] if "asset" in item else item["train_py"],
                        meta=item.get("meta", {}),
                    )
                )
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise AgentStopped(
                    f"{path}:{number}: each line must be a JSON object with 'title' and 'asset' (the full text of "
                    f"the task's asset; 'train_py' is read too) ({error})"
                ) from None
        return cls(proposals)

    def propose(self, ctx: ProposalContext) -> Proposal:
        for proposal in self.proposals:
            if code_hash(proposal.asset) not in ctx.seen_hashes:
                return proposal
        raise AgentStopped(f"all {len(self.proposals)} scripted proposals have been tried")
