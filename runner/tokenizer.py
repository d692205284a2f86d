"""Tokenizer: BPE trained with rustbpe on the training split, used through tiktoken, and its cache.

Cached on disk under a key of (data fingerprint, vocabulary size, cache format). The conductor
reads this cache and a training run may have written to it, so it holds nothing that executes
when read:
- `ranks.tiktoken`: the mergeable tokens in tiktoken's BPE file format, one `base64(token) rank`
  line per token, ranks 0..n-1 in order;
- `token_bytes.npy`: the UTF-8 byte length of every token (0 for special tokens), which
  evaluation needs for bits per byte; a plain int32 array, read with allow_pickle=False;
- `tokenizer.json`, written last, so that its presence means the cache is complete: the name,
  the split pattern, the special tokens, the vocabulary size and the sha256 of the two files.
Loading checks all of it and refuses a cache that does not add up (DataCorrupt, naming the
directory to delete). The earlier format (a pickled `tokenizer.pkl`) lived under another key and
is never opened, wherever it lies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import rustbpe
import tiktoken

from runner import files
from runner.data import DataCorrupt, DataMissing, Dataset, cache_dir

if TYPE_CHECKING:  # torch is imported where a tokenizer is loaded: the cache's layout needs none of it
    import torch

# GPT-4 style pre-tokenisation, with numbers split into runs of at most two digits.
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = [f"<|reserved_{i}|>" for i in range(4)]
BOS_TOKEN = SPECIAL_TOKENS[0]
MAX_DOC_CHARS = 10_000  # long documents are cut for tokenizer training only

# Bump when the files of the cache change: the directory name changes with it, so an older cache
# is never read (format 1 was a pickle).
CACHE_FORMAT = 2
RANKS_FILE = "ranks.tiktoken"
TOKEN_BYTES_FILE = "token_bytes.npy"
INFO_FILE = "tokenizer.json"


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
    return cache_dir() / "tokenizer" / f"{dataset.fingerprint}-v{vocab_size}-format{CACHE_FORMAT}"


def encoding_name(dataset: Dataset, vocab_size: int) -> str:
    return f"autoresearch-{dataset.fingerprint}-{vocab_size}"


def is_cached(dataset: Dataset, vocab_size: int) -> bool:
    """Whether a complete cache exists (it may still fail its checks when loaded)."""
    return (tokenizer_dir(dataset, vocab_size) / INFO_FILE).exists()


def load_tokenizer(dataset: Dataset, vocab_size: int, profile_name: str = "cpu") -> Tokenizer:
    """Load the cached tokenizer and check it: DataMissing if there is none, DataCorrupt if the
    files on disk are not a tokenizer of this vocabulary size for this data."""
    directory = tokenizer_dir(dataset, vocab_size)
    redo = f"Delete {directory} and run `autoresearch prepare --profile {profile_name}`."
    if not (directory / INFO_FILE).exists():
        if (directory / RANKS_FILE).exists() or (directory / TOKEN_BYTES_FILE).exists():
            raise DataMissing(
                f"the tokenizer cache in {directory} is incomplete (no {INFO_FILE}: an interrupted prepare?). {redo}"
            )
        raise DataMissing(
            f"no tokenizer with vocabulary {vocab_size} for this data (looked in "
            f"{directory}). Run `autoresearch prepare --profile {profile_name}` first."
        )
    try:
        return _read_cache(directory, vocab_size, encoding_name(dataset, vocab_size))
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as error:
        raise DataCorrupt(f"the tokenizer cache in {directory} is unusable: {error}. {redo}") from None


def prepare_tokenizer(
    dataset: Dataset, vocab_size: int, max_chars: int, profile_name: str = "cpu"
) -> tuple[Tokenizer, bool]:
    """Train (or reuse) the tokenizer. Returns it and whether it was trained now."""
    if is_cached(dataset, vocab_size):
        return load_tokenizer(dataset, vocab_size, profile_name), False
    directory = tokenizer_dir(dataset, vocab_size)
    directory.mkdir(parents=True, exist_ok=True)

    started = time.time()
    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(_training_text(dataset, max_chars), vocab_size - len(SPECIAL_TOKENS), pattern=SPLIT_PATTERN)
    ranks = {bytes(token): rank for token, rank in bpe.get_mergeable_ranks()}
    if len(ranks) + len(SPECIAL_TOKENS) != vocab_size:
        raise RuntimeError(
            f"the training text gave {len(ranks)} BPE tokens, not the "
            f"{vocab_size - len(SPECIAL_TOKENS)} that a vocabulary of {vocab_size} needs: "
            "use more (or more varied) data, or a profile with a smaller vocabulary"
        )
    if bpe.get_pattern() != SPLIT_PATTERN:
        raise RuntimeError("rustbpe changed the split pattern it was given; check the rustbpe version")
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    encoding = tiktoken.Encoding(
        name=encoding_name(dataset, vocab_size), pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )
    sample = "Hello world! 123 4567. Ünïcödé: 你好, naïve café 🙂"
    if encoding.decode(encoding.encode_ordinary(sample)) != sample:
        raise RuntimeError(
            f"tokenizer failed its round-trip check; delete {directory} and run "
            f"`autoresearch prepare --profile {profile_name}` again"
        )

    ranks_data = _ranks_file(ranks)
    token_bytes_data = _npy_bytes(_token_lengths(ranks, len(specials)))
    files.write_bytes(directory / RANKS_FILE, ranks_data)
    files.write_bytes(directory / TOKEN_BYTES_FILE, token_bytes_data)
    (directory / "trained.txt").write_text(f"trained in {time.time() - started:.1f}s\n")
    info = {
        "format": CACHE_FORMAT,
        "name": encoding.name,
        "pattern": SPLIT_PATTERN,
        "special_tokens": specials,
        "n_vocab": vocab_size,
        "ranks_sha256": hashlib.sha256(ranks_data).hexdigest(),
        "token_bytes_sha256": hashlib.sha256(token_bytes_data).hexdigest(),
    }
    files.write_text(directory / INFO_FILE, json.dumps(info, indent=2))  # last: the cache is complete
    return load_tokenizer(dataset, vocab_size, profile_name), True  # what later runs will read


# --- the cache files ----------------------------------------------------------------------------
# tiktoken.load has dump_tiktoken_bpe/load_tiktoken_bpe for this format, but the first needs the
# optional blobfile package, and the second reads through a shared cache in the system temp
# directory keyed by the path, where another process could place a file that is then read instead
# of ours. The format is two fields a line; reading it here, strictly, is simpler than either.


def _ranks_file(ranks: dict[bytes, int]) -> bytes:
    ordered = sorted(ranks.items(), key=lambda item: item[1])
    return b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n" for token, rank in ordered)


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        fields = line.split(b" ")
        if len(fields) != 2 or not fields[1].isdigit():
            raise ValueError(f"{RANKS_FILE} line {number} is not `base64-token rank`")
        try:
            token = base64.b64decode(fields[0], validate=True)
        except binascii.Error:
            raise ValueError(f"{RANKS_FILE} line {number} has a token that is not base64") from None
        if int(fields[1]) != len(ranks):
            raise ValueError(
                f"{RANKS_FILE} line {number} has rank {int(fields[1])}, expected "
                f"{len(ranks)} (ranks must be 0, 1, 2, ... in order)"
            )
        if not token or token in ranks:
            raise ValueError(f"{RANKS_FILE} line {number} repeats a token or has an empty one")
        ranks[token] = len(ranks)
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(
            f"{RANKS_FILE} lacks {len(missing)} of the 256 single bytes, so some text could not be encoded"
        )
    return ranks


def _token_lengths(ranks: dict[bytes, int], n_special: int) -> np.ndarray:
    lengths = [len(token) for token, _ in sorted(ranks.items(), key=lambda item: item[1])]
    return np.array(lengths + [0] * n_special, dtype=np.int32)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _read_cache(directory: Path, vocab_size: int, name: str) -> Tokenizer:
    info: dict[str, Any] = json.loads((directory / INFO_FILE).read_text(encoding="utf-8"))
    if not isinstance(info, dict) or info.get("format") != CACHE_FORMAT:
        raise ValueError(f"{INFO_FILE} is not a format-{CACHE_FORMAT} tokenizer description")
    if info["n_vocab"] != vocab_size:
        raise ValueError(f"it has a vocabulary of {info['n_vocab']}, not {vocab_size}")
    if info["name"] != name or info["pattern"] != SPLIT_PATTERN:
        raise ValueError(f"{INFO_FILE} names another tokenizer or split pattern")

    ranks_data = (directory / RANKS_FILE).read_bytes()
    if hashlib.sha256(ranks_data).hexdigest() != info["ranks_sha256"]:
        raise ValueError(f"{RANKS_FILE} changed after it was written (sha256 mismatch)")
    ranks = _parse_ranks(ranks_data)
    specials = {token: len(ranks) + i for i, token in enumerate(SPECIAL_TOKENS)}
    if info["special_tokens"] != specials:
        raise ValueError(f"its special tokens are not {SPECIAL_TOKENS} after the {len(ranks)} BPE tokens")
    if len(ranks) + len(specials) != vocab_size:
        raise ValueError(
            f"{RANKS_FILE} has {len(ranks)} tokens; with {len(specials)} special tokens "
            f"that is not a vocabulary of {vocab_size}"
        )

    token_bytes_data = (directory / TOKEN_BYTES_FILE).read_bytes()
    if hashlib.sha256(token_bytes_data).hexdigest() != info["token_bytes_sha256"]:
        raise ValueError(f"{TOKEN_BYTES_FILE} changed after it was written (sha256 mismatch)")
    token_bytes = np.load(io.BytesIO(token_bytes_data), allow_pickle=False)
    if token_bytes.dtype != np.int32 or token_bytes.shape != (vocab_size,):
        raise ValueError(f"{TOKEN_BYTES_FILE} holds {token_bytes.dtype} {token_bytes.shape}, not int32 ({vocab_size},)")
    if not np.array_equal(token_bytes, _token_lengths(ranks, len(specials))):
        raise ValueError(f"{TOKEN_BYTES_FILE} does not hold the byte lengths of the tokens")

    encoding = tiktoken.Encoding(
        name=name, pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=specials, explicit_n_vocab=vocab_size
    )
    import torch

    return Tokenizer(encoding, torch.from_numpy(token_bytes.copy()))


def _training_text(dataset: Dataset, max_chars: int) -> Iterator[str]:
    seen = 0
    for docs, _ in dataset.document_batches("train", loop=False):
        for doc in docs:
            doc = doc[:MAX_DOC_CHARS]
            seen += len(doc)
            yield doc
            if seen >= max_chars:
                return
