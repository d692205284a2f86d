"""runner.prepare: the "training the tokenizer" spinner shows only while a tokenizer is trained, and a CUDA
profile's Flash Attention 3 kernel is fetched (runner.kernels) without a failed fetch failing the prepare."""

from __future__ import annotations

import pytest

from runner import kernels
from runner.prepare import _fetch_flash_attention, prepare

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


def test_a_kernel_that_cannot_be_fetched_costs_speed_not_the_prepare(tmp_path, monkeypatch, capsys):
    def no_hub(repo, revision, cache):
        raise kernels.KernelError("the Hugging Face Hub (https://huggingface.co) is not reachable from here")

    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "install_with_kernels", no_hub)
    line = _fetch_flash_attention(progress=True)
    assert line == (
        "Flash Attention 3 not fetched (the Hugging Face Hub (https://huggingface.co) is not reachable from here): "
        "runs on this machine will use PyTorch's SDPA"
    )
    assert line in capsys.readouterr().err


def test_a_cpu_profile_fetches_no_kernel(tmp_path, monkeypatch):
    def never(repo, revision, cache):
        raise AssertionError("a CPU profile fetched a GPU kernel")

    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "install_with_kernels", never)
    assert prepare("smoke").flash_attention == ""
