"""The Claude agent: one proposal is one tool-use session with Claude over an in-memory workspace.

Claude gets the system prompt and the context (bot.agent.prompt), edits the task's asset
(/repo/train.py for training, /repo/router.py, /repo/query.sql: `ProposalContext.task`) with
Anthropic's text editor tool and ends with `submit` (bot.agent.editor). The final asset, with the
title and hypothesis it submitted, is the `Proposal`.

What can go wrong, and what it becomes:
- A bad tool call (bad arguments, an unknown file, a write outside the asset, an edit that does
  not apply) is answered with an error and Claude may retry; a second failure of the same kind in a
  row skips the proposal. A submit that is unchanged from main, does not compile, is too large, no
  longer uses the harness (train.py), fails its task's static check (another asset), or repeats an
  earlier experiment is explained once per kind, then skipped. Ending a turn without submit gets one reminder, a reply cut off at max_tokens one
  warning; the last turn within the turn or token limit is announced, and going past it skips.
  A refusal, or a request the API rejects as invalid, skips at once.
  Skipping raises `ProposalSkipped`, a failure of this one proposal with its reason and cost.
- The API unavailable (429, 529, 5xx, timeouts, connection errors) after the SDK's own retries,
  with its backoff: `ClaudeUnavailable`, which the conductor retries later with its backoff.
- No key, a key the API rejects, no access to the model or no credit: `AgentStopped`, which stops
  the loop with the message.
Each is an AgentError (bot.core.protocols) whose `meta` holds what the session cost so far.

Prompt caching: breakpoints on the last tool, on the system prompt, on the context's stable block
(program.md and main's asset) and one that moves to the newest user content each turn, so that
every turn reads the conversation so far from the cache and pays only for what is new.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, NoReturn

import anthropic

from bot.agent import pricing
from bot.agent.editor import (
    BAD_CALL,
    EDITOR_NAMES,
    Submission,
    ToolResult,
    Workspace,
    check_asset,
    editor_tool,
    parse_submit,
    submit_tool,
)
from bot.agent.prompt import EPHEMERAL, context_blocks, system_prompt
from bot.core.protocols import AgentError, AgentStopped
from bot.core.records import Proposal, ProposalContext, code_hash
from runner.tasks import get_task

log = logging.getLogger(__name__)

NO_KEY = (
    "The Claude agent needs an Anthropic API key and none is set. Set ANTHROPIC_API_KEY in the "
    "environment (or the service's .env file) to a key from https://console.anthropic.com/settings/keys, "
    "or use the offline explorer, the default agent without a key (AUTORESEARCH_AGENT=explorer)."
)
CHARS_PER_TOKEN = 3.0  # a cautious estimate of a request's size before it is sent


@dataclass
class ClaudeConfig:
    model: str = "claude-sonnet-4-6"
    max_tokens: int = 8192  # per response
    max_turns: int = 12  # model calls per proposal
    max_input_tokens: int = 400_000  # per proposal, all turns together (uncached + cache reads + cache writes)
    temperature: float = 1.0
    timeout_s: float = 120.0  # one request
    max_retries: int = 4  # the SDK's retries (429, 529, 5xx, connection errors), with its backoff and jitter
    max_asset_bytes: int = 200_000
    prices: pricing.Prices | None = None  # None: the list prices of the model's family
    base_url: str | None = None  # tests and proxies

    def __post_init__(self) -> None:
        if self.prices is None:
            self.prices = pricing.prices_for(self.model)


class ProposalSkipped(AgentError):
    """This proposal was given up (the message says why, in words for the record); `meta` holds the
    model, the turns, the token usage and its cost. The agent can be asked again."""


class ClaudeUnavailable(AgentError):
    """The Anthropic API did not answer after the SDK's retries; ask again later. `meta` as above."""


class ClaudeAgent:
    """Proposes experiments by letting Claude edit the task's asset (implements bot.agent.Agent)."""

    def __init__(
        self, config: ClaudeConfig, *, api_key: str | None = None, client: anthropic.Anthropic | None = None
    ) -> None:
        """`client`: an Anthropic client to use as it is (its own timeout and retries); otherwise one
        is built from the key (`api_key`, else ANTHROPIC_API_KEY) and the config."""
        self.config = config
        if client is None:
            key = (api_key or os.environ.get("ANTHROPIC_API_KEY") or "").strip()
            if not key:
                raise AgentStopped(NO_KEY)
            client = anthropic.Anthropic(
                api_key=key, base_url=config.base_url, timeout=config.timeout_s, max_retries=config.max_retries
            )
        self.client = client

    def tools(self, task: str) -> list[dict[str, Any]]:
        """The text editor and the task's submit tool (the last one carries a cache breakpoint)."""
        return [editor_tool(self.config.model), dict(submit_tool(task), cache_control=dict(EPHEMERAL))]

    def propose(self, ctx: ProposalContext) -> Proposal:
        return _Session(self, ctx).run()


class _Session:
    """The state of one proposal: the conversation, the workspace, what it cost, what was said once."""

    def __init__(self, agent: ClaudeAgent, ctx: ProposalContext) -> None:
        self.config = agent.config
        self.client = agent.client
        self.tools = agent.tools(ctx.task)
        self.ctx = ctx
        self.asset_name = get_task(ctx.task).asset
        self.workspace = Workspace(ctx.asset, ctx.program_md, asset_name=self.asset_name)
        self.system = [{"type": "text", "text": system_prompt(ctx.task), "cache_control": dict(EPHEMERAL)}]
        self.messages: list[dict[str, Any]] = []
        self.usage = {key: 0 for key in pricing.USAGE_FIELDS}
        self.turns = 0
        self.told: set[str] = set()  # problems already explained once
        self.last_error: str | None = None  # the kind of the previous tool call's failure
        self._marked: dict[str, Any] | None = None  # the block holding the moving cache breakpoint

    # --- the session -------------------------------------------------------------------------------
    def run(self) -> Proposal:
        content: list[dict[str, Any]] = context_blocks(self.ctx)
        estimate = self._chars(self.system, self.tools, content) / CHARS_PER_TOKEN
        for turn in range(1, self.config.max_turns + 1):
            room = self.config.max_input_tokens - self._input_used()
            if estimate > room:
                self._skip(
                    f"token limit: the next request (about {estimate:,.0f} input tokens) would pass the "
                    f"proposal's limit of {self.config.max_input_tokens:,} input tokens "
                    f"({self._input_used():,} used)"
                )
            last = turn == self.config.max_turns or 2 * estimate > room
            if last:
                content.append(
                    {
                        "type": "text",
                        "text": (
                            "This is your last turn within this proposal's turn and token limits: call submit now "
                            "(after at most this one round of edits), or the proposal is skipped."
                        ),
                    }
                )
            self._send(content)
            response = self._call()
            proposal, content = self._reply(response)
            if proposal is not None:
                return proposal
            if last:
                break
            estimate = (
                self._request_input(response) + response.usage.output_tokens + self._chars(content) / CHARS_PER_TOKEN
            )
        what = "turn" if self.turns >= self.config.max_turns else "token"
        self._skip(
            f"{what} limit: no accepted submit after {self.turns} model calls ({self._input_used():,} input tokens)"
        )

    def _reply(self, response: Any) -> tuple[Proposal | None, list[dict[str, Any]]]:
        """Handle one response: (the proposal if submitted, else the next user content)."""
        stop = response.stop_reason
        if stop == "refusal":
            details = getattr(response, "stop_details", None)
            why = (
                getattr(details, "explanation", None)
                or getattr(details, "category", None)
                or _text(response)
                or "no reason given"
            )
            self._skip(f"the model refused: {why}")
        if stop == "model_context_window_exceeded":
            self._skip("the conversation outgrew the model's context window")
        assistant = [_param(block) for block in response.content]
        assistant = [b for b in assistant if b is not None]
        if assistant:
            self.messages.append({"role": "assistant", "content": assistant})
        calls = [b for b in response.content if b.type == "tool_use"]
        if stop == "max_tokens":
            self._once("max_tokens", f"the model's reply was cut off at max_tokens ({self.config.max_tokens}) twice")
            results = [
                _result(
                    b.id, "Not carried out: your reply was cut off at max_tokens before this call was complete.", True
                )
                for b in calls
            ]
            return None, results + [
                {
                    "type": "text",
                    "text": (
                        f"Your reply was cut off at {self.config.max_tokens} tokens. Keep replies short: make small "
                        f"str_replace edits instead of rewriting {self.asset_name}, then call submit."
                    ),
                }
            ]
        if not calls:
            self._once("no submit", "the model ended its turn twice without calling submit")
            return None, [
                {
                    "type": "text",
                    "text": (
                        f"You ended your turn without calling submit. Make your change to /repo/{self.asset_name} if "
                        "you have not, then call the submit tool; a proposal without submit is skipped."
                    ),
                }
            ]
        results = []
        for call in calls:
            outcome = self._tool(call)
            if isinstance(outcome, Proposal):
                return outcome, []
            results.append(_result(call.id, outcome.text, outcome.is_error))
        if self._input_used() > self.config.max_input_tokens:
            self._skip(
                f"token limit: {self._input_used():,} input tokens used, over the proposal's limit of "
                f"{self.config.max_input_tokens:,}"
            )
        return None, results

    # --- tools -------------------------------------------------------------------------------------
    def _tool(self, call: Any) -> ToolResult | Proposal:
        if call.name in EDITOR_NAMES:
            outcome = self.workspace.run(call.input)
        elif call.name == "submit":
            return self._submit(call.input)
        else:
            outcome = ToolResult(f"Unknown tool {call.name!r}: use the text editor or submit.", BAD_CALL)
        if outcome.error is not None:
            if outcome.error == self.last_error:
                self._skip(f"the model made a second {outcome.error} in a row: {outcome.text}")
            log.info("claude: tool error (%s): %s", outcome.error, outcome.text)
        self.last_error = outcome.error
        return outcome

    def _submit(self, arguments: Any) -> ToolResult | Proposal:
        parsed = parse_submit(arguments)
        if isinstance(parsed, ToolResult):
            if self.last_error == parsed.error:
                self._skip(f"the model made a second {parsed.error} in a row: {parsed.text}")
            self.last_error = parsed.error
            return parsed
        self.last_error = None
        text = self.workspace.asset
        problem = check_asset(
            text, main_asset=self.ctx.asset, max_bytes=self.config.max_asset_bytes, task=self.ctx.task
        )
        if problem is None and code_hash(text) in self.ctx.seen_hashes:
            earlier = next((e for e in reversed(self.ctx.history) if e.code_hash == code_hash(text)), None)
            which = f"experiment #{earlier.id} ({earlier.title!r})" if earlier else "an earlier experiment"
            problem = (
                "repeat",
                f"This {self.asset_name} repeats {which}: its result is known already. Change something else, "
                "then submit.",
            )
        if problem is not None:
            kind, message = problem
            self._once(
                f"submit {kind}", f"the model submitted twice a {self.asset_name} that {_SUBMIT_WHY[kind]}: {message}"
            )
            return ToolResult(message, f"submit {kind}")
        return self._proposal(parsed, text)

    def _proposal(self, sub: Submission, text: str) -> Proposal:
        meta = self._meta() | {"expected": sub.expected_effect, "risk": sub.risk}
        if sub.fixes_failure and self.ctx.last_crash_id is not None:
            meta["fixes"] = self.ctx.last_crash_id
            meta["fixes_status"] = self.ctx.last_crash_status  # crash, or rejected by the evaluator
        log.info("claude: proposal %r after %d turns, $%.4f", sub.title, self.turns, meta["cost_usd"])
        return Proposal(title=sub.title, hypothesis=sub.hypothesis, asset=text, meta=meta)

    # --- the API -----------------------------------------------------------------------------------
    def _send(self, content: list[dict[str, Any]]) -> None:
        """Add the user's turn; the moving cache breakpoint goes to its last block."""
        if self._marked is not None:
            self._marked.pop("cache_control", None)
        if content and "cache_control" not in content[-1]:
            content[-1]["cache_control"] = dict(EPHEMERAL)
            self._marked = content[-1]
        if self.messages and self.messages[-1]["role"] == "user":  # the reply had no content to keep
            self.messages[-1]["content"].extend(content)
        else:
            self.messages.append({"role": "user", "content": content})

    def _call(self) -> Any:
        try:
            response = self.client.messages.create(
                model=self.config.model,
                max_tokens=self.config.max_tokens,
                system=self.system,
                tools=self.tools,
                messages=self.messages,
                extra_body=self._sampling(),
            )
        except anthropic.APIStatusError as error:
            self._api_error(error)
        except anthropic.APIConnectionError as error:  # timeouts included, after the SDK's retries
            raise ClaudeUnavailable(
                f"the Anthropic API could not be reached ({type(error).__name__}: {error}) "
                f"after {self.config.max_retries} retries; the proposal is asked again later",
                self._meta(),
            ) from error
        self.turns += 1
        for key in pricing.USAGE_FIELDS:
            self.usage[key] += int(getattr(response.usage, key, 0) or 0)
        log.info(
            "claude: turn %d: %s, %d input tokens (%d cache reads, %d cache writes), %d output tokens",
            self.turns,
            response.stop_reason,
            self._request_input(response),
            response.usage.cache_read_input_tokens or 0,
            response.usage.cache_creation_input_tokens or 0,
            response.usage.output_tokens,
        )
        return response

    def _sampling(self) -> dict[str, Any] | None:
        """temperature, sent only when it is not the API's default of 1.0: this SDK no longer lists the
        sampling parameters, which the API still takes, so they travel in the body's extras."""
        return None if self.config.temperature == 1.0 else {"temperature": self.config.temperature}

    def _api_error(self, error: anthropic.APIStatusError) -> NoReturn:
        status, message = error.status_code, _api_message(error)
        if status == 401:
            raise AgentStopped(
                f"The Anthropic API rejected the API key (401: {message}). Set ANTHROPIC_API_KEY to a "
                "valid key from https://console.anthropic.com/settings/keys, or use the offline "
                "explorer (AUTORESEARCH_AGENT=explorer).",
                self._meta(),
            ) from error
        if status in (402, 403) or (status == 400 and "credit balance" in message.lower()):
            raise AgentStopped(
                f"The Anthropic API refused to serve this key ({status}: {message}). Check the "
                "account's billing and the key's permissions in the Anthropic console.",
                self._meta(),
            ) from error
        if status == 404:
            raise AgentStopped(
                f"The Anthropic API does not offer model {self.config.model!r} to this key (404: "
                f"{message}). Configure a model the key can use.",
                self._meta(),
            ) from error
        if status in (408, 409, 429) or status >= 500:
            raise ClaudeUnavailable(
                f"the Anthropic API answered {status} ({message}) after "
                f"{self.config.max_retries} retries; the proposal is asked again later",
                self._meta(),
            ) from error
        self._skip(f"the Anthropic API rejected the request ({status}: {message})")

    # --- bookkeeping -------------------------------------------------------------------------------
    def _once(self, kind: str, reason: str) -> None:
        """Allow a problem of this kind once; the second time, skip with `reason`."""
        if kind in self.told:
            self._skip(reason)
        self.told.add(kind)

    def _skip(self, reason: str) -> NoReturn:
        log.warning("claude: proposal skipped after %d turns: %s", self.turns, reason)
        raise ProposalSkipped(reason, self._meta())

    def _meta(self) -> dict[str, Any]:
        assert self.config.prices is not None
        return {
            "model": self.config.model,
            "turns": self.turns,
            "usage": dict(self.usage),
            "cost_usd": pricing.cost_usd(self.usage, self.config.prices),
        }

    def _input_used(self) -> int:
        return (
            self.usage["input_tokens"]
            + self.usage["cache_creation_input_tokens"]
            + self.usage["cache_read_input_tokens"]
        )

    @staticmethod
    def _request_input(response: Any) -> int:
        u = response.usage
        return u.input_tokens + (u.cache_creation_input_tokens or 0) + (u.cache_read_input_tokens or 0)

    @staticmethod
    def _chars(*parts: Any) -> int:
        return sum(len(json.dumps(part, default=str)) for part in parts)


_SUBMIT_WHY = {
    "unchanged": "is identical to main's",
    "too large": "is too large",
    "does not compile": "does not compile",
    "harness interface": "no longer uses the harness interface",
    "repeat": "repeats an earlier experiment",
    "invalid": "fails its task's static check",
}


def _param(block: Any) -> dict[str, Any] | None:
    """A response block as it goes back in the conversation (empty text dropped)."""
    if block.type == "text":
        return {"type": "text", "text": block.text} if block.text else None
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return block.model_dump(mode="json", exclude_none=True)


def _result(tool_use_id: str, text: str, is_error: bool) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}
    if is_error:
        block["is_error"] = True
    return block


def _text(response: Any) -> str:
    return " ".join(b.text for b in response.content if b.type == "text").strip()


def _api_message(error: anthropic.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and body["error"].get("message"):
        return str(body["error"]["message"])
    return str(error.message)
