"""Agents: whatever turns a `ProposalContext` into the next experiment's `Proposal`.

An agent reads the current main's train.py, the history of earlier experiments and any human
feedback, and returns a new full train.py together with a short title and a plain-English
hypothesis. Two kinds exist: an LLM-backed agent (when an API key is configured) and the
`OfflineExplorer` (bot.agent.explorer), a deterministic bandit search over the hyperparameter
block of train.py that needs no network.

An agent that cannot propose anything useful raises `AgentError` with a message meant for a human.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from bot.records import Proposal, ProposalContext

__all__ = ["Agent", "AgentError"]


@runtime_checkable
class Agent(Protocol):
    """Anything that proposes the next experiment."""

    def propose(self, ctx: ProposalContext) -> Proposal:
        """Return a new train.py (never one whose code_hash is in ctx.seen_hashes) and why."""
        ...


class AgentError(Exception):
    """The agent could not produce a proposal; the message says why and what to do about it."""
