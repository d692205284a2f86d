"""The measurement identity and the data fingerprint it is built on: recomputed from the parquet
files, so a file changed after preparation is caught, and the error says how to recover."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runner import identity
from runner.data import DataCorrupt, DataMissing, load_dataset, verify_dataset
from runner.identity import measurement_identity
from runner.profiles import get_profile, harness_hash
from runner.tokenizer import tokenizer_dir


@pytest.fixture
def private_copy(smoke_prepared, tmp_path, monkeypatch) -> Path:
    """A private cache with a copy of the prepared smoke data and tokenizer; returns the data dir."""
    dataset = smoke_prepared.dataset
    tokenizer = tokenizer_dir(dataset, smoke_prepared.tokenizer.vocab_size)
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "cache" / dataset.root.relative_to(dataset.root.parents[1])
    shutil.copytree(dataset.root, root)
    shutil.copytree(tokenizer, tokenizer_dir(dataset, smoke_prepared.tokenizer.vocab_size))
    return root


def test_verify_returns_the_manifest_fingerprint(smoke_prepared):
    assert verify_dataset(smoke_prepared.dataset) == smoke_prepared.dataset.fingerprint


def test_verify_detects_a_modified_parquet_file(private_copy):
    dataset = load_dataset("builtin", "smoke")
    val = private_copy / dataset.val_file
    texts = pq.read_table(val).column("text").to_pylist()
    texts[0] = "An easier validation text."  # still a well-formed parquet file
    pq.write_table(pa.table({"text": pa.array(texts, type=pa.string())}), val)

    with pytest.raises(DataCorrupt) as error:
        verify_dataset(dataset, "smoke")
    message = str(error.value)
    assert str(private_copy) in message and dataset.fingerprint in message
    assert f"Delete {private_copy} and run `autoresearch prepare --profile smoke`" in message
    assert isinstance(error.value, DataMissing), "callers that catch DataMissing catch this too"
    with pytest.raises(DataCorrupt, match="--profile P"):  # no profile given: says which to use
        verify_dataset(dataset)


def test_verify_detects_a_missing_parquet_file(private_copy):
    dataset = load_dataset("builtin", "smoke")
    (private_copy / dataset.train_files[0]).unlink()
    with pytest.raises(DataCorrupt, match=f"{private_copy} is incomplete.*--profile smoke"):
        verify_dataset(dataset, "smoke")


def test_manifest_naming_files_elsewhere_is_refused(private_copy):
    manifest = private_copy / "manifest.json"
    info = json.loads(manifest.read_text())
    manifest.write_text(json.dumps(dict(info, val_file="../../elsewhere/val.parquet")))
    with pytest.raises(DataCorrupt, match="outside its directory"):
        load_dataset("builtin", "smoke")
    manifest.write_text("{")
    with pytest.raises(DataCorrupt, match=f"unreadable.*Delete {private_copy}"):
        load_dataset("builtin", "smoke")


def test_measurement_identity_of_the_prepared_data(smoke_prepared):
    assert measurement_identity("smoke") == {
        "profile": "smoke",
        "harness_hash": harness_hash(),
        "data_fingerprint": smoke_prepared.dataset.fingerprint,
    }
    assert measurement_identity("smoke", "builtin") == measurement_identity("smoke")


def test_a_cpu_clock_identity_pins_the_threads_a_run_gets(smoke_prepared, monkeypatch):
    assert measurement_identity("smoke", threads=4) == dict(measurement_identity("smoke"), threads="4")
    wall = dataclasses.replace(get_profile("smoke"), clock="wall")
    monkeypatch.setattr(identity, "get_profile", lambda name: wall)
    assert "threads" not in measurement_identity("smoke", threads=4)  # a wall-clock budget is not per thread


def test_measurement_identity_refuses_corrupt_or_missing_data(private_copy, tmp_path, monkeypatch):
    assert measurement_identity("smoke")["data_fingerprint"] == load_dataset("builtin").fingerprint
    dataset = load_dataset("builtin", "smoke")
    tokenizer = tokenizer_dir(dataset, 1024)
    shutil.move(tokenizer, tmp_path / "tokenizer-aside")
    with pytest.raises(DataMissing, match="no tokenizer.*--profile smoke"):
        measurement_identity("smoke")
    shutil.move(tmp_path / "tokenizer-aside", tokenizer)
    with open(private_copy / dataset.train_files[-1], "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(DataCorrupt, match="--profile smoke"):
        measurement_identity("smoke")

    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "empty"))
    with pytest.raises(DataMissing, match="autoresearch prepare --profile smoke"):
        measurement_identity("smoke")
    with pytest.raises(ValueError, match="unknown profile"):
        measurement_identity("nope")
