"""runner.data: the three data sources, the train/val split, idempotent preparation, fingerprints."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runner import data
from runner.data import DataMissing, load_dataset, prepare_dataset
from runner.profiles import REFERENCE_VAL_SHARD


def all_docs(dataset: data.Dataset, split: str) -> list[str]:
    return [doc for docs, _ in dataset.document_batches(split, loop=False) for doc in docs]


def mtimes(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(root.iterdir())}


# --- builtin ------------------------------------------------------------------------------------


def test_builtin_prepare_is_idempotent(smoke_prepared):
    dataset = smoke_prepared.dataset
    manifest = dataset.root / "manifest.json"
    before = mtimes(dataset.root)

    again = prepare_dataset("builtin")

    assert again == dataset
    assert manifest.stat().st_mtime_ns == before["manifest.json"]
    assert mtimes(dataset.root) == before, "a second prepare must not rewrite anything"
    assert load_dataset("builtin") == dataset


def test_builtin_split_and_fingerprint_are_stable(smoke_prepared, tmp_path, monkeypatch):
    dataset = smoke_prepared.dataset
    assert dataset.source == "builtin"
    distinct = len(set(data._builtin_documents()))
    assert dataset.train_docs + dataset.val_docs == distinct
    assert dataset.val_docs == distinct // data.VAL_EVERY
    assert len(all_docs(dataset, "train")) == dataset.train_docs
    assert len(all_docs(dataset, "val")) == dataset.val_docs

    # the fingerprint depends on the content only: a fresh cache elsewhere gives the same one
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "other-cache"))
    fresh = prepare_dataset("builtin")
    assert fresh.root != dataset.root
    assert fresh.fingerprint == dataset.fingerprint
    assert (fresh.train_files, fresh.val_file) == (dataset.train_files, dataset.val_file)


def test_training_split_loops_and_counts_epochs(smoke_prepared):
    dataset = smoke_prepared.dataset
    per_epoch = sum(1 for _ in dataset.document_batches("train", batch_size=100, loop=False))
    batches = dataset.document_batches("train", batch_size=100)
    epochs = [next(batches)[1] for _ in range(per_epoch + 1)]
    assert epochs[:per_epoch] == [1] * per_epoch
    assert epochs[per_epoch] == 2
    with pytest.raises(ValueError):
        dataset.paths("test")


# --- a directory of text files ------------------------------------------------------------------


def write_docs(directory: Path, count: int) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    texts = []
    for i in range(count):
        text = f"Document number {i}.\nIt says something only document {i} says: {'ab' * i}.\n"
        (directory / f"doc_{i:02d}.txt").write_text(text, encoding="utf-8")
        texts.append(text)
    return texts


def test_text_directory_every_tenth_document_is_validation(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "texts"
    texts = write_docs(source, 25)
    (source / "ignored.csv").write_text("not,a,document\n")
    (source / "ignored.json").write_text('{"text": "not a document"}')

    dataset = prepare_dataset(str(source))

    assert dataset.source == str(source)
    assert (dataset.train_docs, dataset.val_docs) == (23, 2)
    assert all_docs(dataset, "val") == [texts[9], texts[19]]
    assert all_docs(dataset, "train") == [t for i, t in enumerate(texts) if i not in (9, 19)]
    assert dataset.root.parent == tmp_path / "cache" / "data"
    assert load_dataset(str(source)) == dataset

    # idempotent: the manifest is not rewritten, even if the directory changes afterwards
    manifest_mtime = (dataset.root / "manifest.json").stat().st_mtime_ns
    write_docs(source / "more", 5)
    assert prepare_dataset(str(source)) == dataset
    assert (dataset.root / "manifest.json").stat().st_mtime_ns == manifest_mtime


def test_text_directory_with_few_documents_keeps_the_last_for_validation(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "texts"
    texts = write_docs(source, 4)
    (source / "notes.md").write_text("# Markdown counts too\n")
    (source / "blank.txt").write_text("   \n\n")  # empty documents are skipped
    dataset = prepare_dataset(str(source))
    # sorted by path: blank.txt (skipped), doc_00..doc_03, notes.md
    assert all_docs(dataset, "train") == texts
    assert all_docs(dataset, "val") == ["# Markdown counts too\n"]


def test_directory_with_fewer_than_two_documents_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "texts"
    write_docs(source, 1)
    (source / "empty.txt").write_text("\n")
    with pytest.raises(DataMissing, match="at least 2"):
        prepare_dataset(str(source))
    with pytest.raises(DataMissing):
        load_dataset(str(source))


def test_unknown_path_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataMissing, match="neither"):
        prepare_dataset(str(tmp_path / "does-not-exist"))


def test_load_unprepared_source_names_the_prepare_command(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(DataMissing) as info:
        load_dataset("builtin", "smoke")
    assert "`autoresearch prepare --profile smoke`" in str(info.value)
    with pytest.raises(DataMissing, match="autoresearch prepare --profile cpu"):
        load_dataset(str(tmp_path / "anything"))
    assert not (tmp_path / "empty-cache").exists(), "loading must never prepare"


def test_source_keys_are_distinct_and_safe():
    keys = {data.source_key(s) for s in ["builtin", "/data/a", "/data/b", "https://x.org/a?b=c"]}
    assert len(keys) == 4
    assert all("/" not in k and "?" not in k for k in keys)


# --- a URL of parquet shards --------------------------------------------------------------------


@pytest.fixture
def shard_server(tmp_path) -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server of parquet shards in the reference's layout; yields its base URL and
    the list of paths requested from it."""
    root = tmp_path / "served"
    root.mkdir()
    for index, rows in [(0, 7), (1, 5), (2, 3), (REFERENCE_VAL_SHARD, 4)]:
        texts = [f"shard {index} document {i}" for i in range(rows)]
        pq.write_table(pa.table({"text": texts}), root / f"shard_{index:05d}.parquet")
    requested: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            requested.append(self.path)
            super().do_GET()

        def log_message(self, *args) -> None:  # keep the test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host}:{port}/", requested
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_url_source_downloads_train_shards_and_the_pinned_validation_shard(shard_server, tmp_path, monkeypatch):
    url, requested = shard_server
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))

    dataset = prepare_dataset(url, train_shards=2)

    assert dataset.train_files == ("shard_00000.parquet", "shard_00001.parquet")
    assert dataset.val_file == f"shard_{REFERENCE_VAL_SHARD:05d}.parquet"
    assert (dataset.train_docs, dataset.val_docs) == (7 + 5, 4)
    assert all_docs(dataset, "train") == (
        [f"shard 0 document {i}" for i in range(7)] + [f"shard 1 document {i}" for i in range(5)]
    )
    assert all_docs(dataset, "val") == [f"shard {REFERENCE_VAL_SHARD} document {i}" for i in range(4)]
    assert not (dataset.root / "shard_00002.parquet").exists()
    assert sorted(requested) == [
        "/shard_00000.parquet",
        "/shard_00001.parquet",
        f"/shard_{REFERENCE_VAL_SHARD:05d}.parquet",
    ]

    # prepared once: a second call fetches nothing
    requested.clear()
    assert prepare_dataset(url, train_shards=2) == dataset
    assert requested == []
    assert load_dataset(url) == dataset
