"""Dataloader: BOS-aligned best-fit packing with no padding.

Every row of T+1 tokens starts with a document's BOS token. Each slot is filled with the longest
buffered document that fits whole; when none fits, the shortest document is cropped to fill the
row exactly. Inputs are row[:-1], targets row[1:]. On CUDA the batch goes through pinned memory
with a non-blocking copy.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import torch

from runner.data import Dataset
from runner.tokenizer import Tokenizer


class DocumentBuffer:
    """Tokenised documents kept sorted by length, for best-fit lookups in O(log n)."""

    def __init__(self) -> None:
        self._lengths: list[int] = []
        self._docs: list[list[int]] = []

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, doc: list[int]) -> None:
        at = bisect.bisect_right(self._lengths, len(doc))
        self._lengths.insert(at, len(doc))
        self._docs.insert(at, doc)

    def pop_longest_fitting(self, room: int) -> list[int] | None:
        at = bisect.bisect_right(self._lengths, room)
        if at == 0:
            return None
        self._lengths.pop(at - 1)
        return self._docs.pop(at - 1)

    def pop_shortest(self) -> list[int]:
        self._lengths.pop(0)
        return self._docs.pop(0)


def packed_rows(
    tokenizer: Tokenizer, documents: Iterator[tuple[list[str], int]], row_len: int, buffer_size: int = 1000
) -> Iterator[tuple[list[int], int]]:
    """Yield (row of exactly row_len tokens, epoch) forever (or until documents run out)."""
    buffer = DocumentBuffer()
    epoch = 1
    exhausted = False

    def refill() -> None:
        nonlocal epoch, exhausted
        while len(buffer) < buffer_size and not exhausted:
            try:
                texts, epoch = next(documents)
            except StopIteration:
                exhausted = True
                return
            for doc in tokenizer.encode_batch(texts, bos=True):
                buffer.add(doc)

    while True:
        row: list[int] = []
        while len(row) < row_len:
            refill()
            if len(buffer) == 0:
                return
            room = row_len - len(row)
            doc = buffer.pop_longest_fitting(room)
            row.extend(doc if doc is not None else buffer.pop_shortest()[:room])
        yield row, epoch


def batches(
    tokenizer: Tokenizer,
    dataset: Dataset,
    split: str,
    batch_size: int,
    seq_len: int,
    device: torch.device,
    loop: bool = True,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
    """Yield (inputs [B, T], targets [B, T], epoch) on `device`."""
    rows = packed_rows(tokenizer, dataset.document_batches(split, loop=loop), seq_len + 1)
    on_cuda = device.type == "cuda"
    host = torch.empty((batch_size, seq_len + 1), dtype=torch.long, pin_memory=on_cuda)
    while True:
        epoch = 1
        for i in range(batch_size):
            try:
                row, epoch = next(rows)
            except StopIteration:
                return
            host[i] = torch.tensor(row, dtype=torch.long)
        if on_cuda:
            batch = host.to(device, non_blocking=True)
            # the next fill of `host` must wait for this copy to finish
            host = torch.empty_like(host, pin_memory=True)
        else:
            batch = host.clone()
        yield batch[:, :-1].contiguous(), batch[:, 1:].contiguous(), epoch
