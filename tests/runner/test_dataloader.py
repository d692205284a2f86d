"""runner.dataloader: best-fit packing, BOS alignment, no padding, no leak of training documents."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from runner.dataloader import DocumentBuffer, batches, packed_rows
from runner.profiles import get_profile
from runner.tokenizer import SPECIAL_TOKENS

SMOKE = get_profile("smoke")
T = SMOKE.seq_len
MIN_LEAK_TOKENS = 20  # a validation piece this long found in a training document would be a leak


# --- DocumentBuffer -----------------------------------------------------------------------------


def doc(length: int, tag: int = 0) -> list[int]:
    return [tag] * length


def test_buffer_pops_the_longest_document_that_fits():
    buffer = DocumentBuffer()
    for length, tag in [(5, 1), (3, 2), (8, 3), (3, 4), (12, 5)]:
        buffer.add(doc(length, tag))
    assert len(buffer) == 5
    assert buffer.pop_longest_fitting(7) == doc(5, 1)
    assert buffer.pop_longest_fitting(8) == doc(8, 3)  # an exact fit counts
    assert buffer.pop_longest_fitting(2) is None  # nothing fits: nothing is removed
    assert len(buffer) == 3
    assert len(buffer.pop_longest_fitting(100)) == 12
    assert sorted([buffer.pop_longest_fitting(3), buffer.pop_longest_fitting(3)]) == [doc(3, 2), doc(3, 4)]
    assert len(buffer) == 0
    assert buffer.pop_longest_fitting(100) is None


def test_buffer_pops_the_shortest_when_none_fits():
    buffer = DocumentBuffer()
    for length, tag in [(9, 1), (4, 2), (6, 3)]:
        buffer.add(doc(length, tag))
    assert buffer.pop_longest_fitting(3) is None
    assert buffer.pop_shortest() == doc(4, 2)
    assert buffer.pop_shortest() == doc(6, 3)
    assert buffer.pop_shortest() == doc(9, 1)
    assert len(buffer) == 0


# --- packing with the real tokenizer on hand-made documents ---------------------------------------


def test_best_fit_packing_fills_rows_exactly(smoke_prepared):
    tokenizer = smoke_prepared.tokenizer
    short, medium, long = "Alas.", "To be, or not to be, that is the question.", "O Romeo! " * 30
    n_short, n_medium, n_long = (len(tokenizer.encode(t, bos=True)) for t in (short, medium, long))
    assert n_short < n_medium < n_short + n_medium < n_long
    row_len = n_short + n_medium

    rows = [row for row, _ in packed_rows(tokenizer, iter([([long, short, medium], 1)]), row_len)]

    bos = tokenizer.bos_id
    # first row: the longest that fits (medium), then the one that fills the rest (short)
    assert rows[0] == tokenizer.encode(medium, bos=True) + tokenizer.encode(short, bos=True)
    # second row: nothing fits, so the shortest left (long) is cropped; its rest is dropped
    assert rows[1] == tokenizer.encode(long, bos=True)[:row_len]
    assert len(rows) == 2
    assert all(row[0] == bos and len(row) == row_len for row in rows)


def test_packing_stops_without_a_partial_row(smoke_prepared):
    tokenizer = smoke_prepared.tokenizer
    texts = ["one two three", "four five", "six"]
    total = sum(len(tokenizer.encode(t, bos=True)) for t in texts)
    rows = list(packed_rows(tokenizer, iter([(texts, 1)]), total + 1))
    assert rows == []  # not enough tokens for one full row: no padding, no short row


def test_epoch_is_reported(smoke_prepared):
    tokenizer = smoke_prepared.tokenizer
    documents = iter([(["a b c d e f g h"] * 4, 1), (["i j k l m n o p"] * 4, 2)])
    epochs = [epoch for _, epoch in packed_rows(tokenizer, documents, 5, buffer_size=1)]
    assert epochs[0] == 1 and epochs[-1] == 2 and epochs == sorted(epochs)


# --- packing the smoke dataset --------------------------------------------------------------------


def token_haystack(encodings: list[list[int]]) -> bytes:
    """Encodings as one byte string of 2-byte tokens, separated by a token that does not exist."""
    separator = np.array([0xFFFF], dtype=">u2").tobytes()
    return separator.join(np.asarray(e, dtype=">u2").tobytes() for e in encodings)


def occurs_in(haystack: bytes, tokens: list[int]) -> bool:
    """Whether `tokens` is a contiguous piece of one of the encodings in `haystack`."""
    needle = np.asarray(tokens, dtype=">u2").tobytes()
    at = haystack.find(needle)
    while at != -1:
        if at % 2 == 0:
            return True
        at = haystack.find(needle, at + 1)
    return False


def segments(row: list[int], bos: int) -> list[list[int]]:
    """The maximal pieces of a row that start with BOS."""
    starts = [i for i, token in enumerate(row) if token == bos]
    return [row[a:b] for a, b in zip(starts, starts[1:] + [len(row)], strict=True)]


@pytest.fixture(scope="module")
def split_docs(smoke_prepared):
    dataset = smoke_prepared.dataset
    return {
        split: [d for docs, _ in dataset.document_batches(split, loop=False) for d in docs]
        for split in ("train", "val")
    }


@pytest.fixture(scope="module")
def encoded(smoke_prepared, split_docs):
    tokenizer = smoke_prepared.tokenizer
    return {split: tokenizer.encode_batch(docs, bos=True) for split, docs in split_docs.items()}


def check_rows(rows: list[list[int]], tokenizer, haystack: bytes) -> None:
    specials = {tokenizer.encoding.encode_single_token(name) for name in SPECIAL_TOKENS}
    bos = tokenizer.bos_id
    for row in rows:
        assert len(row) == T + 1
        assert row[0] == bos
        assert all(0 <= token < tokenizer.vocab_size for token in row)
        assert not (set(row) & (specials - {bos})), "no special token but BOS: no padding"
        for piece in segments(row, bos):
            assert occurs_in(haystack, piece), "every token comes from a document of the split"


def test_train_and_val_documents_are_disjoint(smoke_prepared, split_docs):
    dataset = smoke_prepared.dataset
    assert len(split_docs["train"]) == dataset.train_docs
    assert len(split_docs["val"]) == dataset.val_docs
    assert not set(split_docs["train"]) & set(split_docs["val"])


def test_validation_rows_are_packed_validation_documents(smoke_prepared, encoded):
    tokenizer, dataset = smoke_prepared.tokenizer, smoke_prepared.dataset
    rows = [row for row, _ in packed_rows(tokenizer, dataset.document_batches("val", loop=False), T + 1)]
    assert len(rows) * (T + 1) >= SMOKE.eval_tokens
    check_rows(rows, tokenizer, token_haystack(encoded["val"]))
    # each validation document is used at most once
    pieces = [p for row in rows for p in segments(row, tokenizer.bos_id)]
    assert len(pieces) <= len(encoded["val"])


def test_validation_rows_never_contain_training_documents(smoke_prepared, encoded):
    tokenizer, dataset = smoke_prepared.tokenizer, smoke_prepared.dataset
    train = token_haystack(encoded["train"])
    rows = [row for row, _ in packed_rows(tokenizer, dataset.document_batches("val", loop=False), T + 1)]
    long_pieces = [p for row in rows for p in segments(row, tokenizer.bos_id) if len(p) >= MIN_LEAK_TOKENS]
    assert len(long_pieces) > 100
    leaked = [p for p in long_pieces if occurs_in(train, p)]
    assert leaked == []
    # and the check itself can see a leak: training pieces are found
    train_rows = itertools.islice(packed_rows(tokenizer, dataset.document_batches("train"), T + 1), 20)
    train_pieces = [p for row, _ in train_rows for p in segments(row, tokenizer.bos_id)]
    assert train_pieces and all(occurs_in(train, p) for p in train_pieces)


def test_training_batches_are_shifted_rows(smoke_prepared, encoded):
    tokenizer, dataset = smoke_prepared.tokenizer, smoke_prepared.dataset
    batch_size = 8
    loader = batches(tokenizer, dataset, "train", batch_size, T, torch.device("cpu"))
    expected = packed_rows(tokenizer, dataset.document_batches("train"), T + 1)
    rows = []
    for _ in range(3):
        x, y, epoch = next(loader)
        assert x.shape == y.shape == (batch_size, T)
        assert x.dtype == y.dtype == torch.long
        assert epoch == 1
        assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
        assert (x[:, 0] == tokenizer.bos_id).all()
        for i in range(batch_size):
            row = next(expected)[0]
            assert x[i].tolist() == row[:-1] and y[i].tolist() == row[1:]
            rows.append(row)
    check_rows(rows, tokenizer, token_haystack(encoded["train"]))


def test_batches_do_not_share_memory(smoke_prepared):
    tokenizer, dataset = smoke_prepared.tokenizer, smoke_prepared.dataset
    loader = batches(tokenizer, dataset, "train", 4, T, torch.device("cpu"))
    x1, y1, _ = next(loader)
    kept = x1.clone(), y1.clone()
    next(loader)
    assert torch.equal(x1, kept[0]) and torch.equal(y1, kept[1])


def test_validation_loader_ends(smoke_prepared):
    tokenizer, dataset = smoke_prepared.tokenizer, smoke_prepared.dataset
    rows = sum(1 for _ in packed_rows(tokenizer, dataset.document_batches("val", loop=False), T + 1))
    n_batches = sum(1 for _ in batches(tokenizer, dataset, "val", 16, T, torch.device("cpu"), loop=False))
    assert n_batches == rows // 16  # full batches only, then the loader stops
