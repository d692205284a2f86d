"""Which agent proposes the experiments, and the Claude agent's settings, for `demo` and `serve`.

`explorer` (the default: offline, no key), `claude` (the Anthropic API; `ANTHROPIC_API_KEY`), or
`scripted` (a JSON-lines file of proposals, replayed in order). The Claude agent reads its settings
from `AUTORESEARCH_ANTHROPIC_*` environment variables (or `.env`); a bad one stops the command with
a line naming it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from bot.core.protocols import Agent, AgentStopped

AGENTS = ("explorer", "claude", "scripted")


class ClaudeSettings(BaseSettings):
    """AUTORESEARCH_ANTHROPIC_*: the model, its limits, its prices and the budget."""

    model_config = SettingsConfigDict(env_prefix="AUTORESEARCH_ANTHROPIC_", env_file=".env", extra="ignore")

    model: str = Field("claude-sonnet-4-6", min_length=1, description="the Claude model that proposes")
    max_tokens: int = Field(8192, ge=256, le=128_000, description="tokens per answer")
    max_turns: int = Field(12, ge=1, le=100, description="model calls per proposal")
    max_input_tokens: int = Field(400_000, ge=1_000, description="input tokens per proposal, all turns")
    temperature: float = Field(1.0, ge=0.0, le=1.0, description="sampling temperature, 0 to 1")
    timeout_s: float = Field(120.0, gt=0, le=3600, description="seconds to wait for one answer")
    max_retries: int = Field(4, ge=0, le=10, description="retries of 429, 529, 5xx and lost connections")
    budget_usd: float | None = Field(None, gt=0, description="stop proposing once answers cost this much")
    price_input_per_mtok: float | None = Field(None, ge=0, description="$ per million input tokens")
    price_output_per_mtok: float | None = Field(None, ge=0, description="$ per million output tokens")
    price_cache_write_per_mtok: float | None = Field(None, ge=0, description="$ per million cache-write tokens")
    price_cache_read_per_mtok: float | None = Field(None, ge=0, description="$ per million cache-read tokens")
    base_url: str | None = Field(None, description="another Messages API endpoint (a proxy, a gateway)")
    api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("ANTHROPIC_API_KEY"),
        description="ANTHROPIC_API_KEY, from the environment or .env",
    )


def claude_settings() -> ClaudeSettings:
    try:
        return ClaudeSettings()
    except ValidationError as error:
        lines = [
            f"  AUTORESEARCH_ANTHROPIC_{str(e['loc'][0]).upper()}: {e['msg']}"
            for e in error.errors(include_input=False)
        ]
        raise AgentStopped("the Claude agent's settings need fixing:\n" + "\n".join(lines)) from None


def make_agent(kind: str, *, script: Path | None = None, seed: int = 0) -> tuple[Agent, float | None]:
    """The agent of that kind and its budget in dollars (None: no limit). AgentStopped says what is
    missing (a key, a file) and how to provide it."""
    if kind == "explorer":
        from bot.agent.explorer import OfflineExplorer

        return OfflineExplorer(seed=seed), None
    if kind == "scripted":
        from bot.agent.scripted import ScriptedAgent

        if script is None or not script.is_file():
            raise AgentStopped(
                f"the scripted agent needs its proposals file (JSON lines of title, hypothesis, "
                f"asset); {script or 'none'} is not a file"
            )
        return ScriptedAgent.from_jsonl(script), None
    if kind == "claude":
        from bot.agent import pricing
        from bot.agent.claude import ClaudeAgent, ClaudeConfig

        s = claude_settings()
        listed = pricing.prices_for(s.model)
        prices = pricing.Prices(
            input_per_mtok=listed.input_per_mtok if s.price_input_per_mtok is None else s.price_input_per_mtok,
            output_per_mtok=listed.output_per_mtok if s.price_output_per_mtok is None else s.price_output_per_mtok,
            cache_write_per_mtok=(
                listed.cache_write_per_mtok if s.price_cache_write_per_mtok is None else s.price_cache_write_per_mtok
            ),
            cache_read_per_mtok=(
                listed.cache_read_per_mtok if s.price_cache_read_per_mtok is None else s.price_cache_read_per_mtok
            ),
        )
        config = ClaudeConfig(
            model=s.model,
            max_tokens=s.max_tokens,
            max_turns=s.max_turns,
            max_input_tokens=s.max_input_tokens,
            temperature=s.temperature,
            timeout_s=s.timeout_s,
            max_retries=s.max_retries,
            prices=prices,
            base_url=s.base_url,
        )
        return ClaudeAgent(config, api_key=s.api_key.get_secret_value() if s.api_key else None), s.budget_usd
    raise AgentStopped(f"unknown agent {kind!r}: one of {', '.join(AGENTS)}")
