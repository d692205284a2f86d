"""The causality probe and the model handoff, in this process: which models pass, which do not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runner.handoff import ModelRefused, export_model, load_model
from runner.probe import causality_probe

VOCAB, ROWS, LENGTH = 50, 4, 16


class Causal(torch.nn.Module):
    """Each position sees itself and the positions before it (a running mean of embeddings)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.out = torch.nn.Linear(8, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        counts = torch.arange(1, idx.shape[1] + 1, device=idx.device).view(1, -1, 1)
        return self.out(x.cumsum(dim=1) / counts)


class Peek(Causal):
    def __init__(self, reach: int, amount: float = 1.0) -> None:
        super().__init__()
        self.reach, self.amount = reach, amount

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        ahead = torch.roll(idx, shifts=-self.reach, dims=1)
        return super().forward(idx) + self.amount * torch.nn.functional.one_hot(ahead, VOCAB).float()


class AcrossRows(Causal):
    """Reads the first token of the next row, which no change to later positions touches."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        following = torch.roll(idx, shifts=-1, dims=0)[:, :1]
        return super().forward(idx) + self.out(self.embed(following))


def text() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(0, VOCAB, (ROWS, LENGTH))


def test_a_causal_model_passes() -> None:
    result = causality_probe(Causal(), text())
    assert result.causal and result.max_change == 0.0


@pytest.mark.parametrize("reach", [1, 3, LENGTH // 2])
def test_reading_any_later_token_fails(reach: int) -> None:
    result = causality_probe(Peek(reach), text())
    assert not result.causal and "reads future tokens" in result.detail


def test_a_leak_too_small_to_matter_passes_and_a_larger_one_fails() -> None:
    assert causality_probe(Peek(1, amount=1e-6), text()).causal
    assert not causality_probe(Peek(1, amount=1e-2), text()).causal


def test_reading_the_next_row_fails() -> None:
    result = causality_probe(AcrossRows(), text())
    assert not result.causal and "across the batch" in result.detail


def test_the_probe_needs_two_rows() -> None:
    with pytest.raises(ValueError):
        causality_probe(Causal(), text()[:1])


def export(model: torch.nn.Module, path: Path) -> Path:
    export_model(model, path, batch_size=ROWS, seq_len=LENGTH, vocab_size=VOCAB, device=torch.device("cpu"))
    return path


def test_an_exported_model_scores_like_the_original(tmp_path: Path) -> None:
    model = Causal()
    loaded = load_model(export(model, tmp_path / "model.pt2"))
    with torch.no_grad():
        assert torch.equal(loaded(text()), model(text()))
    assert not isinstance(loaded, Causal), "no class of the training side crosses over"


class Attending(Causal):
    """Causal attention through scaled_dot_product_attention, which is tagged random for its dropout."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx).unsqueeze(1)
        y = torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True, dropout_p=self.dropout)
        return self.out(y.squeeze(1))


def test_attention_without_dropout_is_accepted(tmp_path: Path) -> None:
    loaded = load_model(export(Attending(), tmp_path / "model.pt2"))
    assert causality_probe(loaded, text()).causal


class Stateful(Causal):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return super().forward(idx) + self.calls


class Noisy(Causal):
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = super().forward(idx)
        return logits + torch.randn_like(logits)


@pytest.mark.parametrize(
    ("model", "why"),
    [(Stateful(), "in place"), (Noisy(), "random numbers"), (Attending(dropout=0.5), "random numbers")],
)
def test_state_and_randomness_are_refused(tmp_path: Path, model: torch.nn.Module, why: str) -> None:
    with pytest.raises(ModelRefused, match=why):
        load_model(export(model, tmp_path / "model.pt2"))


def test_a_file_that_is_not_an_export_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.pt2"
    path.write_bytes(b"not a zip at all")
    with pytest.raises(ModelRefused, match="could not be loaded"):
        load_model(path)


def test_an_untraceable_model_says_how_to_fix_it(tmp_path: Path) -> None:
    class Branchy(Causal):
        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            if idx.sum() > 0:
                return super().forward(idx)
            return super().forward(idx) * 2

    with pytest.raises(RuntimeError, match="traceable"):
        export(Branchy(), tmp_path / "model.pt2")
