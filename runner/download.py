"""Fetching the parquet data shards: one file at a time, or many in parallel.

This module owns getting shard files from a base URL onto local disk safely:
retries with exponential backoff, optional sha256 checks, and atomic writes, so a
failed or interrupted download never leaves a partial or corrupt file behind.
It also owns the quick sanity check that a shard is a parquet file with a `text`
column of strings. Which shards to fetch, and from where, is decided by the caller.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

logger = logging.getLogger(__name__)

_NEXT_STEP = "Check the URL and your network connection, then re-run `autoresearch prepare`."
_CHUNK_BYTES = 1 << 20
_MAX_BACKOFF_S = 60.0


class DownloadError(Exception):
    """A file could not be fetched, or is not what it should be. The message says what to do next."""


class _Retryable(Exception):
    """An attempt failed in a way that another attempt may fix."""


def shard_name(index: int) -> str:
    """File name of data shard `index`, e.g. 7 -> 'shard_00007.parquet'."""
    return f"shard_{index:05d}.parquet"


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's contents."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(_CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def _display_url(url: str) -> str:
    """The URL without query string or credentials, safe to show in logs and errors."""
    return str(httpx.URL(url).copy_with(query=None, fragment=None, userinfo=b""))


def _temp_path(dest: Path) -> Path:
    """A temporary file next to `dest`, unique to this process and thread."""
    return dest.with_name(f"{dest.name}.part-{os.getpid()}-{threading.get_ident()}")


def _fetch_once(
    client: httpx.Client,
    url: str,
    part: Path,
    timeout_s: float,
    on_bytes: Callable[[int], None] | None,
) -> str:
    """One attempt: stream `url` into `part`, fsync it, return the sha256 of what was written."""
    digest = hashlib.sha256()
    with client.stream("GET", url, timeout=timeout_s) as response:
        status = response.status_code
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}")
        if status >= 400:
            raise DownloadError(f"Download of {_display_url(url)} failed with HTTP {status}. {_NEXT_STEP}")
        with part.open("wb") as f:
            for chunk in response.iter_bytes(_CHUNK_BYTES):
                f.write(chunk)
                digest.update(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
            f.flush()
            os.fsync(f.fileno())
    return digest.hexdigest()


def _attempt(
    client: httpx.Client,
    url: str,
    dest: Path,
    sha256: str | None,
    timeout_s: float,
    on_bytes: Callable[[int], None] | None,
) -> None:
    """One attempt that either puts a verified file at `dest` or leaves no trace."""
    part = _temp_path(dest)
    try:
        try:
            actual = _fetch_once(client, url, part, timeout_s, on_bytes)
        except httpx.TransportError as exc:  # connection refused or dropped, timeouts, broken bodies
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        if sha256 is not None and actual != sha256.lower():
            raise _Retryable(f"checksum mismatch: expected sha256 {sha256.lower()}, got {actual}")
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)


def download_file(
    url: str,
    dest: Path,
    *,
    sha256: str | None = None,
    retries: int = 5,
    backoff_s: float = 1.0,
    timeout_s: float = 60.0,
    client: httpx.Client | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> Path:
    """Download `url` to `dest` atomically and return `dest`.

    If `dest` already exists (and matches `sha256`, when given) nothing is fetched.
    Connection errors, timeouts, HTTP 5xx/429 and checksum mismatches are retried up to
    `retries` times, waiting `backoff_s`, then twice as long each time. Any other HTTP
    error fails at once. `on_bytes` gets the size of every chunk received, including
    chunks of attempts that are later retried.
    """
    dest = Path(dest)
    if dest.exists():
        if sha256 is None or file_sha256(dest) == sha256.lower():
            return dest
        logger.warning("%s does not match its checksum; removing it and downloading again.", dest)
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)

    shown = _display_url(url)
    own_client = client is None
    http = httpx.Client(follow_redirects=True) if client is None else client
    attempts = max(retries, 0) + 1
    last_error: _Retryable | None = None
    try:
        for attempt in range(attempts):
            try:
                _attempt(http, url, dest, sha256, timeout_s, on_bytes)
                return dest
            except OSError as exc:  # a full disk, a read-only cache: retrying will not help
                raise DownloadError(
                    f"could not write {dest.name} to {dest.parent}: {exc.strerror or exc}. Free some disk "
                    "space there (or point AUTORESEARCH_CACHE at a larger disk) and run "
                    "`autoresearch prepare` again."
                ) from exc
            except _Retryable as exc:
                last_error = exc
                if attempt + 1 < attempts:
                    wait_s = min(backoff_s * 2**attempt, _MAX_BACKOFF_S)
                    logger.warning(
                        "Download of %s failed (attempt %d of %d): %s. Retrying in %.2f s.",
                        shown,
                        attempt + 1,
                        attempts,
                        exc,
                        wait_s,
                    )
                    time.sleep(wait_s)
    finally:
        if own_client:
            http.close()
    raise DownloadError(
        f"Download of {shown} failed after {attempts} attempts; last error: {last_error}. {_NEXT_STEP}"
    ) from last_error


def _progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())


def download_shards(
    base_url: str,
    indices: Iterable[int],
    dest_dir: Path,
    *,
    checksums: Mapping[str, str] | None = None,
    retries: int = 5,
    backoff_s: float = 1.0,
    workers: int = 4,
    progress: bool = False,
) -> list[Path]:
    """Download shards `indices` from `base_url` into `dest_dir`, in parallel.

    `checksums` maps a shard's file name to its expected sha256. Returns the local paths
    in the order of `indices`. If any shard fails, the others stay on disk and a
    DownloadError names every shard that failed.
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    names = [shard_name(i) for i in indices]
    unique = list(dict.fromkeys(names))  # never fetch one file twice at the same time
    checksums = checksums or {}
    root = base_url.rstrip("/")

    bar = _progress_bar() if progress else None
    task = bar.add_task(f"shards 0/{len(unique)}", total=None) if bar else None
    on_bytes = (lambda n: bar.advance(task, n)) if bar else None
    lock = threading.Lock()
    done = 0

    def fetch(client: httpx.Client, name: str) -> Path:
        nonlocal done
        path = download_file(
            f"{root}/{name}",
            dest_dir / name,
            sha256=checksums.get(name),
            retries=retries,
            backoff_s=backoff_s,
            client=client,
            on_bytes=on_bytes,
        )
        if bar:
            with lock:
                done += 1
                bar.update(task, description=f"shards {done}/{len(unique)}")
        return path

    failures: dict[str, BaseException] = {}
    if bar:
        bar.start()
    try:
        with httpx.Client(follow_redirects=True) as client, ThreadPoolExecutor(max(1, workers)) as pool:
            futures = {name: pool.submit(fetch, client, name) for name in unique}
        for name, future in futures.items():
            if future.exception() is not None:
                failures[name] = future.exception()
    finally:
        if bar:
            bar.stop()

    if failures:
        for name, exc in failures.items():
            logger.error("Shard %s failed: %s", name, exc)
        raise DownloadError(
            f"{len(failures)} of {len(unique)} shards failed to download: {', '.join(failures)}. "
            f"Shards that succeeded are kept in {dest_dir}. {_NEXT_STEP}"
        )
    return [dest_dir / name for name in names]


def validate_parquet(path: Path) -> int:
    """Check that `path` is a parquet file with a `text` column of strings; return its row count."""
    path = Path(path)
    fix = f"Delete {path} and re-run `autoresearch prepare` to fetch it again."
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DownloadError(f"{path} is not a readable parquet file ({exc}). {fix}") from exc
    schema = parquet.schema_arrow
    if "text" not in schema.names:
        raise DownloadError(f"{path} has no `text` column (columns: {', '.join(schema.names)}). {fix}")
    text_type = schema.field("text").type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise DownloadError(f"{path}: column `text` holds {text_type}, not strings. {fix}")
    return parquet.metadata.num_rows
