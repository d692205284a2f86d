"""runner.prepare: the "training the tokenizer" spinner shows only while a tokenizer is trained."""

from __future__ import annotations

import pytest

from runner.prepare import prepare

MESSAGE = "training the 1024-token BPE tokenizer"


@pytest.mark.parametrize("terminal", [True, False])
def test_spinner_shows_only_when_the_tokenizer_is_trained(tmp_path, monkeypatch, capsys, terminal):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    if terminal:  # rich's documented switches: draw the spinner as on a terminal
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
        monkeypatch.delenv("TTY_COMPATIBLE", raising=False)

    first = prepare("smoke", progress=True)
    shown = capsys.readouterr()
    second = prepare("smoke", progress=True)
    cached = capsys.readouterr()

    assert first.trained_tokenizer and not second.trained_tokenizer
    assert MESSAGE in shown.err
    assert MESSAGE not in cached.err + cached.out
