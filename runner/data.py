"""Data: where training and validation documents come from, and their fingerprint.

Three sources end up in one shape, a prepared dataset directory of parquet files with one `text`
column plus a `manifest.json`:
- "builtin": the Shakespeare corpus that ships in `runner/corpus/` (works offline);
- a base URL of parquet shards in the reference's layout (`shard_00000.parquet`, ...; the pinned
  validation shard is the last one), downloaded by `runner.download`;
- a local directory of `.txt`/`.md` files, one document per file.
The validation documents are fixed by the source and never used for training.

The fingerprint is a sha256 over the names and contents of the parquet files, written to the
manifest at preparation; `verify_dataset` recomputes it from the files, so that a measurement
identity can name data that is really on disk.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from runner import files

BUILTIN_CORPUS = Path(__file__).parent / "corpus" / "shakespeare.jsonl.gz"
BUILTIN_DOC_CHARS = 400  # about 110 tokens with the cpu profile's tokenizer
VAL_EVERY = 10  # for builtin and text-directory sources, every 10th document is validation
PREPARE_VERSION = 2  # bump when the way sources become datasets changes: old caches are not reused
DOCS_PER_SHARD = 1000


class DataMissing(RuntimeError):
    """The dataset (or tokenizer) has not been prepared yet."""


class DataCorrupt(DataMissing):
    """A prepared dataset (or tokenizer) on disk is not what preparation wrote: a file was changed,
    cut short or removed. The cure is to delete the directory and prepare again."""


def cache_dir() -> Path:
    """Root of the data and tokenizer cache: $AUTORESEARCH_CACHE or ~/.cache/autoresearch."""
    root = os.environ.get("AUTORESEARCH_CACHE") or Path.home() / ".cache" / "autoresearch"
    return Path(root)


def source_key(source: str) -> str:
    """A directory name for a data source."""
    if source == "builtin":  # the cut of the corpus is part of its identity
        return f"builtin-shakespeare-{BUILTIN_DOC_CHARS}c-val{VAL_EVERY}-v{PREPARE_VERSION}"
    readable = re.sub(r"[^A-Za-z0-9]+", "-", source).strip("-")[-40:]
    return f"{readable}-{hashlib.sha256(source.encode()).hexdigest()[:10]}-v{PREPARE_VERSION}"


@dataclass(frozen=True)
class Dataset:
    """A prepared dataset: its parquet files and the fingerprint that identifies its content."""

    root: Path
    source: str
    fingerprint: str
    train_files: tuple[str, ...]
    val_file: str
    train_docs: int
    val_docs: int

    def paths(self, split: str) -> list[Path]:
        if split == "train":
            return [self.root / name for name in self.train_files]
        if split == "val":
            return [self.root / self.val_file]
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")

    def document_batches(self, split: str, batch_size: int = 128, loop: bool = True) -> Iterator[tuple[list[str], int]]:
        """Yield (documents, epoch) in a fixed order; the training split loops forever."""
        if not self.paths(split):
            raise DataMissing(
                f"the dataset in {self.root} has no {split} files; prepare it again with at least one training shard"
            )
        epoch = 1
        while True:
            for path in self.paths(split):
                parquet = pq.ParquetFile(path)
                for group in range(parquet.num_row_groups):
                    texts = parquet.read_row_group(group, columns=["text"]).column("text").to_pylist()
                    for start in range(0, len(texts), batch_size):
                        yield texts[start : start + batch_size], epoch
            if not loop:
                return
            epoch += 1


def dataset_dir(source: str) -> Path:
    return cache_dir() / "data" / source_key(source)


def load_dataset(source: str, profile_name: str = "cpu") -> Dataset:
    """Open a prepared dataset, or say exactly which command prepares it."""
    manifest = dataset_dir(source) / "manifest.json"
    if not manifest.exists():
        raise DataMissing(
            f"no prepared data for source {source!r} (looked in {manifest.parent}). "
            f"Run `autoresearch prepare --profile {profile_name}` first."
        )
    try:
        info = json.loads(manifest.read_text())
        dataset = Dataset(
            root=manifest.parent,
            source=str(info["source"]),
            fingerprint=str(info["fingerprint"]),
            train_files=tuple(str(name) for name in info["train_files"]),
            val_file=str(info["val_file"]),
            train_docs=int(info["train_docs"]),
            val_docs=int(info["val_docs"]),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise DataCorrupt(
            f"{manifest} is unreadable ({type(error).__name__}: {error}). {_redo(manifest.parent, profile_name)}"
        ) from None
    if any(
        Path(name).name != name or not name.endswith(".parquet") for name in (*dataset.train_files, dataset.val_file)
    ):  # files live in the directory itself
        raise DataCorrupt(f"{manifest} names files outside its directory. {_redo(manifest.parent, profile_name)}")
    return dataset


def verify_dataset(dataset: Dataset, profile_name: str | None = None) -> str:
    """Recompute the fingerprint from the parquet files; return it if it matches the manifest's,
    raise DataCorrupt otherwise (a changed, truncated or missing file)."""
    names = [*dataset.train_files, dataset.val_file]
    try:
        actual = _fingerprint(dataset.root, names)
    except OSError as error:
        raise DataCorrupt(
            f"the prepared data in {dataset.root} is incomplete ({error}). {_redo(dataset.root, profile_name)}"
        ) from None
    if actual != dataset.fingerprint:
        raise DataCorrupt(
            f"the prepared data in {dataset.root} does not match its manifest (fingerprint "
            f"{actual} on disk, {dataset.fingerprint} recorded): a parquet file was changed "
            f"after preparation. {_redo(dataset.root, profile_name)}"
        )
    return actual


def _redo(root: Path, profile_name: str | None = None) -> str:
    """What to do about a corrupt cache directory, in the user's words."""
    if profile_name:
        return f"Delete {root} and run `autoresearch prepare --profile {profile_name}` again."
    return f"Delete {root} and run `autoresearch prepare --profile P` again (P: the profile you train with)."


def prepare_dataset(source: str, *, train_shards: int = 1, progress: bool = False) -> Dataset:
    """Materialise a source into a dataset directory; a second call does no work."""
    root = dataset_dir(source)
    is_url = source.startswith(("http://", "https://"))
    if (root / "manifest.json").exists():
        prepared = load_dataset(source)
        if not (is_url and len(prepared.train_files) < max(1, train_shards)):
            return prepared  # else: more shards were asked for than were downloaded; fetch the rest
    root.mkdir(parents=True, exist_ok=True)
    if source == "builtin":
        train_files, val_file = _write_split_shards(root, _builtin_documents())
    elif is_url:
        train_files, val_file = _download_reference_shards(source, root, train_shards, progress)
    else:
        directory = Path(source).expanduser()
        if not directory.is_dir():
            raise DataMissing(
                f"data source {source!r} is neither 'builtin', an http(s) URL of "
                "parquet shards, nor a directory of .txt/.md files"
            )
        train_files, val_file = _write_split_shards(root, _text_directory_documents(directory))
    return _write_manifest(root, source, train_files, val_file)


def _builtin_documents() -> list[str]:
    """The corpus's parts, cut at paragraph breaks into documents of about BUILTIN_DOC_CHARS, so
    that most fit in one row of the CPU profiles instead of being cropped by the packing."""
    with gzip.open(BUILTIN_CORPUS, "rt", encoding="utf-8") as handle:
        parts = [json.loads(line)["text"] for line in handle if line.strip()]
    docs = []
    for part in parts:
        piece: list[str] = []
        for paragraph in part.split("\n\n"):
            piece.append(paragraph)
            if sum(len(p) for p in piece) >= BUILTIN_DOC_CHARS:
                docs.append("\n\n".join(piece))
                piece = []
        if piece:
            docs.append("\n\n".join(piece))
    return docs


def _text_directory_documents(directory: Path) -> list[str]:
    files = sorted(p for p in directory.rglob("*") if p.suffix in {".txt", ".md"} and p.is_file())
    docs = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    docs = [d for d in docs if d.strip()]
    if len(docs) < 2:
        raise DataMissing(
            f"{directory} holds {len(docs)} non-empty .txt/.md files; at least 2 are "
            "needed (one for training, one for validation)"
        )
    return docs


def _write_split_shards(root: Path, docs: list[str]) -> tuple[list[str], str]:
    """Every VAL_EVERY-th distinct document goes to validation (the last one if there are fewer).
    Exact duplicates are dropped first, so no validation text is also a training text."""
    docs = list(dict.fromkeys(docs))
    val_idx = set(range(VAL_EVERY - 1, len(docs), VAL_EVERY)) or {len(docs) - 1}
    val = [d for i, d in enumerate(docs) if i in val_idx]
    train = [d for i, d in enumerate(docs) if i not in val_idx]
    train_files = []
    for n, start in enumerate(range(0, len(train), DOCS_PER_SHARD)):
        name = f"train_{n:05d}.parquet"
        _write_parquet(root / name, train[start : start + DOCS_PER_SHARD])
        train_files.append(name)
    _write_parquet(root / "val.parquet", val)
    return train_files, "val.parquet"


def _write_parquet(path: Path, texts: list[str]) -> None:
    table = pa.table({"text": pa.array(texts, type=pa.string())})
    files.write_atomically(path, lambda tmp: pq.write_table(table, tmp))


def _download_reference_shards(base_url: str, root: Path, train_shards: int, progress: bool) -> tuple[list[str], str]:
    from runner import download
    from runner.profiles import REFERENCE_VAL_SHARD

    indices = list(range(min(max(1, train_shards), REFERENCE_VAL_SHARD))) + [REFERENCE_VAL_SHARD]
    paths = download.download_shards(base_url, indices, root, progress=progress)
    for path in paths:
        download.validate_parquet(path)
    names = [p.name for p in paths]
    return names[:-1], names[-1]


def _fingerprint(root: Path, names: list[str]) -> str:
    """sha256 over each file's name and the sha256 of its content, in the manifest's order."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        with open(root / name, "rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()[:16]


def _write_manifest(root: Path, source: str, train_files: list[str], val_file: str) -> Dataset:
    counts = {name: pq.ParquetFile(root / name).metadata.num_rows for name in [*train_files, val_file]}
    info = {
        "source": source,
        "fingerprint": _fingerprint(root, [*train_files, val_file]),
        "train_files": train_files,
        "val_file": val_file,
        "train_docs": sum(counts[n] for n in train_files),
        "val_docs": counts[val_file],
    }
    files.write_text(root / "manifest.json", json.dumps(info, indent=2))
    return load_dataset(source)
