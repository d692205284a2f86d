"""The scorer's verdicts (runner.score's Scorer), in this process: a model exported as the training
process exports it is scored on the validation split, or refused with the reason. One warm scorer
serves every test; the isolated run's scoring process runs the same Scorer (tests/runner/test_isolated.py
sends an honest model and a refused one through the whole path)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runner.handoff import export_model, load_model
from runner.profiles import get_profile
from runner.score import params_fingerprint

SMOKE = get_profile("smoke")
HONEST_FLOOR = 3.0  # val_bpb of a model that learned nothing is log2(1024) * tokens / bytes, about 4


class Untrained(torch.nn.Module):
    """Zero logits: a model that learned nothing, so its score is certain (near the uniform one)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(SMOKE.vocab_size, 8)
        self.out = torch.nn.Linear(8, SMOKE.vocab_size)
        torch.nn.init.zeros_(self.out.weight)
        torch.nn.init.zeros_(self.out.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(idx))


class Peek(torch.nn.Module):
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        following = torch.roll(idx, shifts=-1, dims=1)  # the token each position must predict
        return 30.0 * torch.nn.functional.one_hot(following, SMOKE.vocab_size).float()


class Across(torch.nn.Module):
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        nxt = torch.roll(idx, shifts=-1, dims=0)[:, :1].expand_as(idx)  # the next row's first token
        return torch.nn.functional.one_hot(nxt, SMOKE.vocab_size).float()


class Counter(Untrained):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return super().forward(idx) + self.calls


class Noisy(Untrained):
    # Noise in the logits would widen the probe's tolerance for the jitter it sees, room for a leak.
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = super().forward(idx)
        return logits + 0.1 * torch.rand_like(logits)


def exported(model: torch.nn.Module, tmp_path: Path) -> Path:
    """`model` exported as the training process's h.finish(model) exports it."""
    path = tmp_path / "model.pt2"
    export_model(
        model,
        path,
        batch_size=SMOKE.eval_batch_size,
        seq_len=SMOKE.seq_len,
        vocab_size=SMOKE.vocab_size,
        device=torch.device("cpu"),
    )
    return path


def test_an_untrained_model_is_scored_near_the_uniform_bpb(warm_scorer, tmp_path: Path) -> None:
    answer = warm_scorer.score(exported(Untrained(), tmp_path))
    assert answer["val_bpb"] > HONEST_FLOOR and "causal" in answer["probe"]
    assert answer["eval_tokens"] >= SMOKE.eval_tokens and answer["device"] == "cpu"
    assert answer["params_fingerprint"] == params_fingerprint(Untrained())


class Wider(Untrained):
    def __init__(self) -> None:
        super().__init__()
        self.out = torch.nn.Linear(8, SMOKE.vocab_size, bias=False)


def test_the_parameters_fingerprint_tells_shapes_apart_but_not_values(tmp_path: Path) -> None:
    """Only a change that keeps main's parameters' names, shapes and dtypes pairs with main's runs."""
    torch.manual_seed(1)
    first = Untrained()
    torch.manual_seed(2)
    other_values = Untrained()
    assert params_fingerprint(first) == params_fingerprint(other_values)
    assert params_fingerprint(Wider()) != params_fingerprint(first)  # a parameter less
    assert params_fingerprint(Untrained().to(torch.float64)) != params_fingerprint(first)  # another dtype
    assert params_fingerprint(load_model(exported(first, tmp_path))) == params_fingerprint(first)  # as scored


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (Peek(), "reads future tokens"),
        (Across(), "across the batch"),
        (Counter(), "pure function"),
        (Noisy(), "random numbers"),
    ],
    ids=["reads later tokens", "reads the next row", "keeps state between calls", "adds noise"],
)
def test_a_model_that_could_see_its_answers_is_refused(
    warm_scorer, tmp_path: Path, model: torch.nn.Module, why: str
) -> None:
    answer = warm_scorer.score(exported(model, tmp_path))
    assert "val_bpb" not in answer and why in answer["rejected"], answer


def test_a_file_that_is_not_an_exported_model_is_refused(warm_scorer, tmp_path: Path) -> None:
    planted = tmp_path / "model.pt2"
    planted.write_bytes(b"not a zip at all")
    answer = warm_scorer.score(planted)
    assert "val_bpb" not in answer and "could not be loaded" in answer["rejected"]


def test_train_pys_claims_cannot_carry_the_parameters_fingerprint() -> None:
    """The supervisor keeps only CLAIMED_KEYS of what train.py says of itself; the fingerprint is the
    scorer's alone."""
    from runner.isolated import CLAIMED_KEYS

    assert "params_fingerprint" not in CLAIMED_KEYS
