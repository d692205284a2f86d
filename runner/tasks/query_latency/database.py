"""The query-latency task's fixed inputs, prepared once per scale: the shop's database, the
workload run on it, and the reference's rows for each of its parameter sets (generate.py makes
them; this module keeps them).

A profile names a `Scale`: the database's size, the workload's, and how it is measured. A scale's
files live in cache_dir()/query-latency/<scale>-<key>/, the key a hash of what they are made from
(sizes, seeds, reference.sql, generate.VERSION), so a change of any makes a new directory:
shop.sqlite, workload.json and manifest.json. The fingerprint is a sha256 over the database's and
the workload's sha256: the same on every preparation with the same numpy and SQLite. The files are
made in a private directory beside their own and renamed into place whole, so a killed preparation
leaves no half-written database where one is looked for (its private directory is removed by the
next preparation); files that no longer match their manifest (cut short, changed) are made again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runner import files
from runner.data import DataCorrupt, DataMissing, cache_dir
from runner.tasks.query_latency import generate

TASK_DIR = "query-latency"
DB_FILE, WORKLOAD_FILE, MANIFEST_FILE = "shop.sqlite", "workload.json", "manifest.json"


@dataclass(frozen=True)
class Scale:
    """What a profile means for this task: the database's size, the workload, and its measurement."""

    name: str
    customers: int
    products: int
    orders: int  # order_items: about 2.5 per order
    window_months: int  # each parameter set's date window
    parameter_sets: int
    measured_passes: int  # timed executions of every parameter set, after the untimed correctness pass
    time_box_s: float  # the whole measuring process: index builds, the correctness pass, the timed passes

    def key(self) -> str:
        """The cache directory's name: what the files are made from, hashed."""
        made_from = {
            "version": generate.VERSION,
            "customers": self.customers,
            "products": self.products,
            "orders": self.orders,
            "window_months": self.window_months,
            "parameter_sets": self.parameter_sets,
            "seeds": [generate.DATA_SEED, generate.WORKLOAD_SEED],
            "reference": generate.REFERENCE.read_text(),
        }
        return f"{self.name}-{hashlib.sha256(json.dumps(made_from, sort_keys=True).encode()).hexdigest()[:10]}"


SCALES = {
    # tests and a first try: about 37,000 rows, generated in well under a second
    "smoke": Scale("smoke", 2_000, 500, 10_000, 6, 4, 3, 60.0),
    # the task's real size on one machine: about 2.9 million rows, 73 MB
    "cpu": Scale("cpu", 100_000, 20_000, 800_000, 1, 8, 4, 300.0),
}


def get_scale(profile: str) -> Scale:
    try:
        return SCALES[profile]
    except KeyError:
        raise ValueError(
            f"the query-latency task has no {profile!r} profile: choose one of {', '.join(SCALES)}"
        ) from None


@dataclass(frozen=True)
class Prepared:
    """A scale's prepared inputs, as their manifest describes them."""

    root: Path
    scale: str
    fingerprint: str
    db_sha256: str
    db_bytes: int
    parameters: list[dict[str, str]]  # the workload, in the task's order
    reference_rows: list[list[list[Any]]]  # for each parameter set, the reference's rows in order
    table_rows: dict[str, int]

    @property
    def database(self) -> Path:
        return self.root / DB_FILE


def scale_dir(scale: Scale) -> Path:
    return cache_dir() / TASK_DIR / scale.key()


def prepare(profile: str, *, progress: bool = False) -> str:
    """Make the scale's database, workload and reference rows once; later calls check them against
    their manifest (sizes and sha256) and do no other work. Returns the fingerprint."""
    scale = get_scale(profile)
    root = scale_dir(scale)
    try:
        return verify(load(profile)).fingerprint
    except DataCorrupt as error:
        _say(progress, f"making the {profile} database again: {error}")
    except DataMissing:
        pass
    root.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(root)
    partial = root.with_name(f".{root.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        started = time.monotonic()
        _say(progress, f"generating the {profile} database in {root} ...")
        table_rows = generate.database(partial / DB_FILE, scale.customers, scale.products, scale.orders)
        parameters, reference_rows = generate.workload(partial / DB_FILE, scale.window_months, scale.parameter_sets)
        files.write_text(
            partial / WORKLOAD_FILE, json.dumps({"parameters": parameters, "reference_rows": reference_rows})
        )
        _write_manifest(partial, scale, table_rows, time.monotonic() - started)
        try:  # another preparation of the same scale may have finished first
            return verify(load(profile)).fingerprint
        except DataMissing:
            shutil.rmtree(root, ignore_errors=True)
            os.rename(partial, root)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    prepared = load(profile)
    _say(
        progress,
        f"prepared {sum(prepared.table_rows.values()):,} rows ({prepared.db_bytes / 1e6:.0f} MB) and "
        f"{len(prepared.parameters)} parameter sets in {time.monotonic() - started:.1f} s",
    )
    return prepared.fingerprint


def fingerprint(profile: str) -> str:
    """The prepared inputs' fingerprint from their manifest, or DataMissing saying how to prepare them."""
    return load(profile).fingerprint


def load(profile: str) -> Prepared:
    """A scale's prepared inputs as their manifest says; the workload is checked against its sha256,
    the database is not (`verify` and `copy_database` do that)."""
    scale = get_scale(profile)
    root = scale_dir(scale)
    manifest = root / MANIFEST_FILE
    if not manifest.exists():
        raise DataMissing(
            f"the query-latency task's {profile} database is not prepared (looked in {root}): "
            f"run `autoresearch prepare --task query-latency --profile {profile}` first"
        )
    try:
        info = json.loads(manifest.read_text())
        workload_bytes = (root / WORKLOAD_FILE).read_bytes()
        if hashlib.sha256(workload_bytes).hexdigest() != info["workload"]["sha256"]:  # small: checked every time
            raise DataCorrupt(f"{root / WORKLOAD_FILE} changed after its preparation. {_redo(root, profile)}")
        workload = json.loads(workload_bytes)
        return Prepared(
            root=root,
            scale=str(info["scale"]),
            fingerprint=str(info["fingerprint"]),
            db_sha256=str(info["database"]["sha256"]),
            db_bytes=int(info["database"]["bytes"]),
            parameters=[dict(p) for p in workload["parameters"]],
            reference_rows=list(workload["reference_rows"]),
            table_rows={str(k): int(v) for k, v in info["table_rows"].items()},
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataCorrupt(f"{root} is unreadable ({type(error).__name__}: {error}). {_redo(root, profile)}") from None


def verify(prepared: Prepared) -> Prepared:
    """`prepared` if its database is the file its manifest records (size and sha256), else DataCorrupt."""
    path = prepared.database
    size = path.stat().st_size if path.exists() else -1
    if size != prepared.db_bytes or _sha256(path) != prepared.db_sha256:
        raise DataCorrupt(
            f"{path} is not the file its preparation wrote ({size} bytes, {prepared.db_bytes} recorded). "
            f"{_redo(prepared.root, prepared.scale)}"
        )
    return prepared


def copy_database(prepared: Prepared, target: Path) -> None:
    """Copy the database to `target`, checking its sha256 on the way (DataCorrupt if it changed)."""
    digest = hashlib.sha256()
    with open(prepared.database, "rb") as source, open(target, "wb") as sink:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
            sink.write(chunk)
    if digest.hexdigest() != prepared.db_sha256:
        target.unlink()
        raise DataCorrupt(
            f"{prepared.database} changed after its preparation (its sha256 is not the manifest's). "
            f"{_redo(prepared.root, prepared.scale)}"
        )


def _redo(root: Path, profile: str) -> str:
    return f"Run `autoresearch prepare --task query-latency --profile {profile}` to make it again (or delete {root})."


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"[query-latency] {message}", file=sys.stderr, flush=True)


def _remove_abandoned(root: Path) -> None:
    """Private directories of preparations that were killed (their process is gone)."""
    for partial in root.parent.glob(f".{root.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _write_manifest(root: Path, scale: Scale, table_rows: dict[str, int], seconds: float) -> None:
    entries = {}
    for key, name in (("database", DB_FILE), ("workload", WORKLOAD_FILE)):
        path = root / name
        entries[key] = {"file": name, "bytes": path.stat().st_size, "sha256": _sha256(path)}
    fingerprint = hashlib.sha256(f"{entries['database']['sha256']} {entries['workload']['sha256']}".encode())
    info = {
        "task": TASK_DIR,
        "scale": scale.name,
        "fingerprint": fingerprint.hexdigest()[:16],
        **entries,
        "table_rows": table_rows,
        "made_from": asdict(scale),
        "prepare_seconds": round(seconds, 2),
        "sqlite": sqlite3.sqlite_version,
        "numpy": np.__version__,
    }
    files.write_text(root / MANIFEST_FILE, json.dumps(info, indent=2))
