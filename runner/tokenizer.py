"""Tokenizer: BPE trained with rustbpe on the training split, used through tiktoken.

Cached on disk under a key of (data fingerprint, vocabulary size); the cache also holds the byte
length of every token, which evaluation needs for bits per byte (special tokens count 0 bytes).
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from pathlib import Path

import rustbpe
import tiktoken
import torch

from runner import files
from runner.data import Dataset, DataMissing, cache_dir

# GPT-4 style pre-tokenisation, with numbers split into runs of at most two digits.
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = [f"<|reserved_{i}|>" for i in range(4)]
BOS_TOKEN = SPECIAL_TOKENS[0]
MAX_DOC_CHARS = 10_000  # long documents are cut for tokenizer training only


@dataclass
class Tokenizer:
    encoding: tiktoken.Encoding
    token_bytes: torch.Tensor  # int32 [vocab_size]: UTF-8 byte length of each token, 0 for specials

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    @property
    def bos_id(self) -> int:
        return self.encoding.encode_single_token(BOS_TOKEN)

    def encode(self, text: str, bos: bool = False) -> list[int]:
        ids = self.encoding.encode_ordinary(text)
        return [self.bos_id, *ids] if bos else ids

    def encode_batch(self, texts: list[str], bos: bool = False, threads: int = 4) -> list[list[int]]:
        rows = self.encoding.encode_ordinary_batch(texts, num_threads=threads)
        if bos:
            rows = [[self.bos_id, *row] for row in rows]
        return rows

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)


def tokenizer_dir(dataset: Dataset, vocab_size: int) -> Path:
    return cache_dir() / "tokenizer" / f"{dataset.fingerprint}-v{vocab_size}"


def load_tokenizer(dataset: Dataset, vocab_size: int, profile_name: str = "cpu") -> Tokenizer:
    directory = tokenizer_dir(dataset, vocab_size)
    try:
        with open(directory / "tokenizer.pkl", "rb") as handle:
            encoding = pickle.load(handle)
        token_bytes = torch.load(directory / "token_bytes.pt")
    except FileNotFoundError:
        raise DataMissing(f"no tokenizer with vocabulary {vocab_size} for this data (looked in "
                          f"{directory}). Run `autoresearch prepare --profile {profile_name}` first.") from None
    return Tokenizer(encoding, token_bytes)


def prepare_tokenizer(dataset: Dataset, vocab_size: int, max_chars: int) -> tuple[Tokenizer, bool]:
    """Train (or reuse) the tokenizer. Returns it and whether it was trained now."""
    directory = tokenizer_dir(dataset, vocab_size)
    if (directory / "tokenizer.pkl").exists() and (directory / "token_bytes.pt").exists():
        return load_tokenizer(dataset, vocab_size), False
    directory.mkdir(parents=True, exist_ok=True)

    started = time.time()
    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(_training_text(dataset, max_chars), vocab_size - len(SPECIAL_TOKENS),
                            pattern=SPLIT_PATTERN)
    ranks = {bytes(token): rank for token, rank in bpe.get_mergeable_ranks()}
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    encoding = tiktoken.Encoding(name=f"autoresearch-{dataset.fingerprint}-{vocab_size}",
                                 pat_str=bpe.get_pattern(), mergeable_ranks=ranks,
                                 special_tokens=specials)
    token_bytes = torch.tensor([0 if i in specials.values() else len(encoding.decode_single_token_bytes(i))
                                for i in range(encoding.n_vocab)], dtype=torch.int32)

    sample = "Hello world! 123 4567. Ünïcödé: 你好, naïve café 🙂"
    if encoding.decode(encoding.encode_ordinary(sample)) != sample:
        raise RuntimeError("tokenizer failed its round-trip check; delete "
                           f"{directory} and run `autoresearch prepare` again")
    files.write_bytes(directory / "tokenizer.pkl", pickle.dumps(encoding))
    files.write_atomically(directory / "token_bytes.pt", lambda tmp: torch.save(token_bytes, tmp))
    (directory / "trained.txt").write_text(f"trained in {time.time() - started:.1f}s\n")
    return Tokenizer(encoding, token_bytes), True


def _training_text(dataset: Dataset, max_chars: int):
    seen = 0
    for docs, _ in dataset.document_batches("train", loop=False):
        for doc in docs:
            doc = doc[:MAX_DOC_CHARS]
            seen += len(doc)
            yield doc
            if seen >= max_chars:
                return

