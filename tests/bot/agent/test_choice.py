"""Choosing the agent for demo and serve: each kind, its settings from AUTORESEARCH_ANTHROPIC_*, and
clear errors for a missing key, a missing file or a bad setting."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bot.agent.choice import make_agent
from bot.agent.explorer import OfflineExplorer
from bot.agent.scripted import ScriptedAgent
from bot.core.protocols import AgentStopped


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith(("AUTORESEARCH_", "ANTHROPIC_"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no .env of the machine running the tests


def test_the_explorer_is_the_default_and_needs_nothing() -> None:
    agent, budget = make_agent("explorer")
    assert isinstance(agent, OfflineExplorer) and budget is None


def test_the_scripted_agent_reads_its_file(tmp_path: Path) -> None:
    script = tmp_path / "p.jsonl"
    script.write_text(json.dumps({"title": "t", "train_py": "x = 1\n"}) + "\n")
    assert isinstance(make_agent("scripted", script=script)[0], ScriptedAgent)
    with pytest.raises(AgentStopped, match="needs its proposals file"):
        make_agent("scripted", script=tmp_path / "missing.jsonl")


def test_claude_without_a_key_says_how_to_set_one() -> None:
    with pytest.raises(AgentStopped, match="ANTHROPIC_API_KEY"):
        make_agent("claude")


def test_claude_settings_come_from_the_environment_or_dotenv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("ANTHROPIC_API_KEY=sk-ant-from-dotenv\nAUTORESEARCH_ANTHROPIC_BUDGET_USD=2.5\n")
    monkeypatch.setenv("AUTORESEARCH_ANTHROPIC_MODEL", "claude-haiku-4-5")
    monkeypatch.setenv("AUTORESEARCH_ANTHROPIC_PRICE_INPUT_PER_MTOK", "0.5")
    agent, budget = make_agent("claude")
    assert budget == 2.5
    assert agent.config.model == "claude-haiku-4-5" and agent.config.prices.input_per_mtok == 0.5
    assert agent.config.prices.output_per_mtok == 5.0  # the rest from the model's list prices


def test_a_bad_claude_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-x")
    monkeypatch.setenv("AUTORESEARCH_ANTHROPIC_TEMPERATURE", "3")
    with pytest.raises(AgentStopped, match="AUTORESEARCH_ANTHROPIC_TEMPERATURE"):
        make_agent("claude")


def test_an_unknown_agent_lists_the_known_ones() -> None:
    with pytest.raises(AgentStopped, match="explorer, claude, scripted"):
        make_agent("gpt")


def test_the_scripted_agent_takes_any_tasks_asset_under_asset_and_still_reads_train_py(tmp_path: Path) -> None:
    script = tmp_path / "p.jsonl"
    lines = [{"title": "router", "asset": "ALPHA = 0.5\n"}, {"title": "older", "train_py": "x = 2\n"}]
    script.write_text("".join(json.dumps(line) + "\n" for line in lines))
    agent, _ = make_agent("scripted", script=script)
    assert [(p.title, p.asset) for p in agent.proposals] == [("router", "ALPHA = 0.5\n"), ("older", "x = 2\n")]
    script.write_text(json.dumps({"title": "neither"}) + "\n")
    with pytest.raises(AgentStopped, match="with 'title' and 'asset'"):
        make_agent("scripted", script=script)
