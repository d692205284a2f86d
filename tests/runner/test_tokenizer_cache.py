"""runner.tokenizer's cache on disk: a format that executes nothing when read, checked when loaded.

A training run may write into the cache and the conductor reads it, so a pickle planted there
must never be opened, and a cache that does not add up must be refused with the way out (delete
the directory, prepare again)."""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tiktoken.load

from runner.data import DataCorrupt, DataMissing, prepare_dataset
from runner.profiles import get_profile
from runner.tokenizer import load_tokenizer, prepare_tokenizer, tokenizer_dir

SMOKE = get_profile("smoke")
TEXT = "Is this a dagger which I see before me, / The handle toward my hand? 1234 café 🙂"


class PlantedPickle:
    """Unpickling this calls open(marker, "w"): the marker file appears iff the pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str, str]]:
        return builtins.open, (str(self.marker), "w")


@pytest.fixture
def cache_copy(smoke_prepared, tmp_path, monkeypatch) -> Path:
    """A private cache holding a copy of the smoke tokenizer; returns its directory."""
    source = tokenizer_dir(smoke_prepared.dataset, SMOKE.vocab_size)
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    directory = tokenizer_dir(smoke_prepared.dataset, SMOKE.vocab_size)
    shutil.copytree(source, directory)
    return directory


def rewrite(directory: Path, name: str, data: bytes) -> None:
    """Replace a cache file and record its new sha256, so that only the deeper checks can catch it."""
    (directory / name).write_bytes(data)
    info = json.loads((directory / "tokenizer.json").read_text())
    key = {"ranks.tiktoken": "ranks_sha256", "token_bytes.npy": "token_bytes_sha256"}[name]
    info[key] = hashlib.sha256(data).hexdigest()
    (directory / "tokenizer.json").write_text(json.dumps(info))


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_round_trip_through_the_cache_files(smoke_prepared, tmp_path, monkeypatch):
    directory = tokenizer_dir(smoke_prepared.dataset, SMOKE.vocab_size)
    loaded = load_tokenizer(smoke_prepared.dataset, SMOKE.vocab_size, "smoke")
    trained = smoke_prepared.tokenizer
    assert loaded.decode(loaded.encode(TEXT)) == TEXT
    assert loaded.encode(TEXT, bos=True) == trained.encode(TEXT, bos=True)
    assert loaded.token_bytes.tolist() == trained.token_bytes.tolist()
    assert loaded.token_bytes.dtype == trained.token_bytes.dtype

    # the ranks file is tiktoken's own format: tiktoken's loader reads the same ranks
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # its loader's shared cache, off
    ranks = tiktoken.load.load_tiktoken_bpe(str(directory / "ranks.tiktoken"))
    assert len(ranks) == SMOKE.vocab_size - 4
    assert all(loaded.encoding.encode_single_token(token) == rank for token, rank in ranks.items())
    info = json.loads((directory / "tokenizer.json").read_text())
    assert info["n_vocab"] == SMOKE.vocab_size and info["pattern"] == loaded.encoding._pat_str
    assert np.load(directory / "token_bytes.npy", allow_pickle=False).tolist() == loaded.token_bytes.tolist()


def test_planted_pickle_is_never_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    dataset = prepare_dataset("builtin")
    bait = pickle.dumps(PlantedPickle(tmp_path / "proof-the-bait-works"))
    pickle.loads(bait)
    assert (tmp_path / "proof-the-bait-works").exists()

    marker = tmp_path / "pickle-was-loaded"
    bait = pickle.dumps(PlantedPickle(marker))
    directory = tokenizer_dir(dataset, SMOKE.vocab_size)
    old_format = directory.parent / f"{dataset.fingerprint}-v{SMOKE.vocab_size}"  # the format-1 key
    for planted in (old_format, directory):
        planted.mkdir(parents=True)
        (planted / "tokenizer.pkl").write_bytes(bait)
        (planted / "token_bytes.pt").write_bytes(bait)

    with pytest.raises(DataMissing, match="autoresearch prepare --profile smoke"):
        load_tokenizer(dataset, SMOKE.vocab_size, "smoke")  # a pickle alone is no tokenizer
    tokenizer, trained = prepare_tokenizer(dataset, SMOKE.vocab_size, SMOKE.tokenizer_chars, "smoke")
    assert trained, "a directory holding only a pickle is treated as missing: a fresh tokenizer"
    assert load_tokenizer(dataset, SMOKE.vocab_size, "smoke").decode(tokenizer.encode(TEXT)) == TEXT
    assert not marker.exists(), "the planted pickle was unpickled"


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("truncated ranks", "ranks.tiktoken changed after it was written"),
        ("ranks out of order", "ranks must be 0, 1, 2"),
        ("missing single bytes", "lacks 1 of the 256 single bytes"),
        ("token bytes wrong length", r"int32 \(1023,\), not int32 \(1024,\)"),
        ("token bytes wrong values", "does not hold the byte lengths"),
        ("token bytes as a pickled object array", "allow_pickle=False"),
        ("token bytes removed", "No such file"),
        ("info unreadable", "Expecting property name"),
        ("other vocabulary size", "a vocabulary of 2048, not 1024"),
    ],
)
def test_corrupt_cache_names_the_directory_and_the_cure(cache_copy, smoke_prepared, damage, reason):
    directory = cache_copy
    lines = (directory / "ranks.tiktoken").read_bytes().splitlines(keepends=True)
    token_bytes = np.load(directory / "token_bytes.npy")
    if damage == "truncated ranks":  # the recorded sha256 catches it
        (directory / "ranks.tiktoken").write_bytes(b"".join(lines[:-10]))
    elif damage == "ranks out of order":
        rewrite(directory, "ranks.tiktoken", b"".join([lines[1], lines[0], *lines[2:]]))
    elif damage == "missing single bytes":
        renumbered = [line.split(b" ")[0] + b" %d\n" % i for i, line in enumerate(lines[1:])]
        rewrite(directory, "ranks.tiktoken", b"".join(renumbered + [b"//79/A== %d\n" % len(renumbered)]))
    elif damage == "token bytes wrong length":
        rewrite(directory, "token_bytes.npy", npy(token_bytes[:-1]))
    elif damage == "token bytes wrong values":
        rewrite(directory, "token_bytes.npy", npy(np.ones_like(token_bytes)))
    elif damage == "token bytes as a pickled object array":
        rewrite(directory, "token_bytes.npy", npy(np.array([PlantedPickle(directory / "x")], dtype=object)))
    elif damage == "token bytes removed":
        (directory / "token_bytes.npy").unlink()
    elif damage == "info unreadable":
        (directory / "tokenizer.json").write_text("{not json")
    elif damage == "other vocabulary size":
        info = json.loads((directory / "tokenizer.json").read_text())
        (directory / "tokenizer.json").write_text(json.dumps(dict(info, n_vocab=2048)))

    with pytest.raises(DataCorrupt) as error:
        load_tokenizer(smoke_prepared.dataset, SMOKE.vocab_size, "smoke")
    message = str(error.value)
    assert re.search(reason, message), message
    assert f"Delete {directory} and run `autoresearch prepare --profile smoke`" in message
    with pytest.raises(DataCorrupt):  # prepare does not paper over it either
        prepare_tokenizer(smoke_prepared.dataset, SMOKE.vocab_size, SMOKE.tokenizer_chars, "smoke")
    assert not (directory / "x").exists()


def test_partial_cache_is_refused_by_load_and_redone_by_prepare(cache_copy, smoke_prepared):
    directory = cache_copy
    (directory / "tokenizer.json").unlink()  # as if prepare was interrupted before its last write
    with pytest.raises(DataMissing, match=f"{directory} is incomplete.*Delete .*--profile smoke"):
        load_tokenizer(smoke_prepared.dataset, SMOKE.vocab_size, "smoke")
    tokenizer, trained = prepare_tokenizer(smoke_prepared.dataset, SMOKE.vocab_size, SMOKE.tokenizer_chars)
    assert trained
    assert tokenizer.encode(TEXT) == smoke_prepared.tokenizer.encode(TEXT)
