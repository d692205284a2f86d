"""runner.evaluate: bits per byte, checked against an independent count of the validation tokens."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from runner.dataloader import batches, packed_rows
from runner.evaluate import evaluate_bpb
from runner.profiles import get_profile
from runner.tokenizer import SPECIAL_TOKENS

SMOKE = get_profile("smoke")
CPU = torch.device("cpu")


class Uniform(nn.Module):
    """Every token equally likely: logits of zeros."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.weight = nn.Parameter(torch.zeros(1))  # so that the model has a parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*x.shape, self.vocab)


class Unigram(nn.Module):
    """The same distribution at every position: log frequencies of the training tokens."""

    def __init__(self, log_probs: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("log_probs", log_probs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_probs.expand(*x.shape, -1)


class Shaped(nn.Module):
    def __init__(self, make) -> None:
        super().__init__()
        self.make = make

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.make(x)


def evaluate(model: nn.Module, prepared, **overrides):
    kwargs = dict(seq_len=SMOKE.seq_len, eval_tokens=SMOKE.eval_tokens, batch_size=SMOKE.eval_batch_size, device=CPU)
    kwargs.update(overrides)
    return evaluate_bpb(model, prepared.tokenizer, prepared.dataset, **kwargs)


def count_validation_targets(prepared, seq_len: int, eval_tokens: int) -> tuple[int, int, int]:
    """(positions, tokens with bytes, bytes) of the evaluated targets, counted without runner.evaluate:
    the first eval_tokens // seq_len packed validation rows, targets = row[1:], byte lengths from
    the tokenizer's own token table, special tokens (0 bytes) left out."""
    tokenizer = prepared.tokenizer
    encoding = tokenizer.encoding
    specials = {encoding.encode_single_token(name) for name in SPECIAL_TOKENS}
    rows = packed_rows(tokenizer, prepared.dataset.document_batches("val", loop=False), seq_len + 1)
    positions = scored = nbytes = 0
    for _ in range(eval_tokens // seq_len):
        row, _ = next(rows)
        for token in row[1:]:
            positions += 1
            if token in specials:
                continue
            scored += 1
            nbytes += len(encoding.decode_single_token_bytes(token))
    return positions, scored, nbytes


@pytest.mark.parametrize("seq_len", [SMOKE.seq_len, 1024])
def test_uniform_model_scores_log2_vocab_per_token(smoke_prepared, seq_len):
    vocab = smoke_prepared.tokenizer.vocab_size
    positions, scored, nbytes = count_validation_targets(smoke_prepared, seq_len, SMOKE.eval_tokens)
    if seq_len > 1000:  # rows longer than most documents: BOS targets, which are not scored
        assert 0 < scored < positions
    assert 0 < scored <= positions == SMOKE.eval_tokens

    result = evaluate(Uniform(vocab), smoke_prepared, seq_len=seq_len)

    assert (result.tokens, result.scored_tokens, result.bytes) == (positions, scored, nbytes)
    assert result.nats == pytest.approx(scored * math.log(vocab), rel=1e-6)
    assert result.val_bpb == pytest.approx(math.log2(vocab) * scored / nbytes, rel=1e-6)


def test_uniform_model_with_a_padded_vocabulary(smoke_prepared):
    """Extra logit columns (a vocabulary padded for speed) are allowed and do count."""
    vocab = smoke_prepared.tokenizer.vocab_size + 64
    _, scored, nbytes = count_validation_targets(smoke_prepared, SMOKE.seq_len, SMOKE.eval_tokens)
    result = evaluate(Uniform(vocab), smoke_prepared)
    assert result.val_bpb == pytest.approx(math.log2(vocab) * scored / nbytes, rel=1e-6)


def test_batch_size_and_row_count_do_not_change_the_score(smoke_prepared):
    """Rows are cut to exactly eval_tokens // seq_len, whatever the batch size."""
    vocab = smoke_prepared.tokenizer.vocab_size
    eval_tokens = 37 * SMOKE.seq_len + 5  # not a multiple of the batch size
    _, scored, nbytes = count_validation_targets(smoke_prepared, SMOKE.seq_len, eval_tokens)
    for batch_size in (1, 16, 64):
        result = evaluate(Uniform(vocab), smoke_prepared, eval_tokens=eval_tokens, batch_size=batch_size)
        assert (result.tokens, result.scored_tokens, result.bytes) == (37 * SMOKE.seq_len, scored, nbytes)
        assert result.val_bpb == pytest.approx(math.log2(vocab) * scored / nbytes, rel=1e-6)


def test_a_model_that_learned_token_frequencies_scores_lower(smoke_prepared):
    tokenizer, dataset = smoke_prepared.tokenizer, smoke_prepared.dataset
    vocab = tokenizer.vocab_size
    counts = torch.ones(vocab)  # add-one smoothing: no token has probability zero
    loader = batches(tokenizer, dataset, "train", 16, SMOKE.seq_len, CPU)
    for _ in range(8):
        _, y, _ = next(loader)
        counts += torch.bincount(y.reshape(-1), minlength=vocab)
    unigram = Unigram((counts / counts.sum()).log())
    unigram.train()

    uniform = evaluate(Uniform(vocab), smoke_prepared)
    learned = evaluate(unigram, smoke_prepared)

    assert learned.bytes == uniform.bytes and learned.scored_tokens == uniform.scored_tokens
    assert learned.val_bpb < 0.95 * uniform.val_bpb
    assert unigram.training, "evaluation puts the model back in training mode"


def test_evaluation_runs_in_eval_mode_without_gradients(smoke_prepared):
    seen = []

    def logits(x):
        seen.append((model.training, torch.is_grad_enabled()))
        return torch.zeros(*x.shape, smoke_prepared.tokenizer.vocab_size)

    model = Shaped(logits)
    model.train()
    evaluate(model, smoke_prepared)
    assert seen and all(mode == (False, False) for mode in seen)
    assert model.training


@pytest.mark.parametrize("shape", ["short_sequence", "small_vocab", "flat", "no_vocab_dim"])
def test_wrong_logit_shape_is_a_clear_error(smoke_prepared, shape):
    vocab = smoke_prepared.tokenizer.vocab_size
    make = {
        "short_sequence": lambda x: torch.zeros(x.shape[0], x.shape[1] - 1, vocab),
        "small_vocab": lambda x: torch.zeros(*x.shape, vocab - 1),
        "flat": lambda x: torch.zeros(x.numel(), vocab),
        "no_vocab_dim": lambda x: torch.zeros(*x.shape),
    }[shape]
    with pytest.raises(RuntimeError, match=r"model\(x\) must return logits \[B, T, V>=1024\], got"):
        evaluate(Shaped(make), smoke_prepared)


def test_non_finite_logits_are_refused(smoke_prepared):
    vocab = smoke_prepared.tokenizer.vocab_size
    model = Shaped(lambda x: torch.full((*x.shape, vocab), float("nan")))
    with pytest.raises(FloatingPointError, match="not finite"):
        evaluate(model, smoke_prepared)


def test_too_few_validation_tokens_is_a_clear_error(smoke_prepared):
    vocab = smoke_prepared.tokenizer.vocab_size
    with pytest.raises(RuntimeError, match="fewer than"):
        evaluate(Uniform(vocab), smoke_prepared, eval_tokens=10**7, batch_size=64)
