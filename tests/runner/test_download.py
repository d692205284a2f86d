"""runner.download against a real HTTP server on 127.0.0.1 that can be told to misbehave."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runner.download import DownloadError, download_file, download_shards, shard_name, validate_parquet

FAST = 0.01  # backoff_s for tests


class ShardServer(ThreadingHTTPServer):
    """Serves files from `root`. `script[name]` lists what to do for the next requests of `name`:
    an int is answered as that HTTP status, "corrupt" serves the file with one byte changed,
    "truncate" promises the full length, sends half and hangs up. Unscripted requests are served
    normally (404 when the file is missing)."""

    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.script: dict[str, list[int | str]] = {}
        self.hits: list[str] = []
        self.delay_s = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def next_action(self, name: str) -> int | str:
        with self.lock:
            self.hits.append(name)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            steps = self.script.get(name)
            return steps.pop(0) if steps else "serve"

    def finished(self) -> None:
        with self.lock:
            self.in_flight -= 1


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ShardServer

    def do_GET(self) -> None:
        name = self.path.split("?")[0].lstrip("/")
        action = self.server.next_action(name)
        try:
            time.sleep(self.server.delay_s)
            file = self.server.root / name
            if isinstance(action, int):
                self._reply(action, b"scripted failure")
            elif not file.is_file():
                self._reply(404, b"not found")
            elif action == "corrupt":
                body = bytearray(file.read_bytes())
                body[len(body) // 2] ^= 0xFF
                self._reply(200, bytes(body))
            elif action == "truncate":
                body = file.read_bytes()
                self._reply(200, body[: len(body) // 2], content_length=len(body))
                self.wfile.flush()
                self.close_connection = True
            else:
                self._reply(200, file.read_bytes())
        finally:
            self.server.finished()

    def _reply(self, status: int, body: bytes, content_length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body) if content_length is None else content_length))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ShardServer]:
    root = tmp_path / "served"
    root.mkdir()
    srv = ShardServer(root)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


@pytest.fixture
def dest_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def serve_bytes(server: ShardServer, name: str, size: int = 200_000) -> bytes:
    data = bytes(i % 251 for i in range(size))
    (server.root / name).write_bytes(data)
    return data


def write_shard(path: Path, rows: int) -> None:
    table = pa.table({"text": [f"document {i} of {path.name}" for i in range(rows)]})
    pq.write_table(table, path)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".part" in p.name) if directory.exists() else []


def test_shard_name_is_zero_padded() -> None:
    assert shard_name(0) == "shard_00000.parquet"
    assert shard_name(6542) == "shard_06542.parquet"


def test_server_errors_are_retried_then_download_succeeds(
    server: ShardServer, dest_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = serve_bytes(server, "a.bin")
    server.script["a.bin"] = [500, 503, 429]
    seen: list[int] = []

    with caplog.at_level(logging.WARNING, logger="runner.download"):
        path = download_file(
            f"{server.url}/a.bin", dest_dir / "a.bin", sha256=sha256(data), backoff_s=FAST, on_bytes=seen.append
        )

    assert server.hits == ["a.bin"] * 4
    assert path.read_bytes() == data
    assert sum(seen) == len(data)
    assert [r.getMessage().count("Retrying") for r in caplog.records] == [1, 1, 1]
    assert leftovers(dest_dir) == []


def test_not_found_fails_at_once_naming_the_url(server: ShardServer, dest_dir: Path) -> None:
    url = f"{server.url}/missing.parquet"

    with pytest.raises(DownloadError, match="404") as info:
        download_file(url, dest_dir / "missing.parquet", backoff_s=FAST)

    assert url in str(info.value)
    assert "autoresearch prepare" in str(info.value)
    assert server.hits == ["missing.parquet"]
    assert not (dest_dir / "missing.parquet").exists()
    assert leftovers(dest_dir) == []


def test_query_string_is_kept_out_of_errors(server: ShardServer, dest_dir: Path) -> None:
    with pytest.raises(DownloadError) as info:
        download_file(f"{server.url}/missing.parquet?token=s3cret", dest_dir / "m.parquet", backoff_s=FAST)

    assert "s3cret" not in str(info.value)
    assert f"{server.url}/missing.parquet" in str(info.value)


def test_corrupted_download_is_rejected_by_checksum(server: ShardServer, dest_dir: Path) -> None:
    data = serve_bytes(server, "a.bin")
    expected = sha256(data)
    server.script["a.bin"] = ["corrupt"] * 3

    with pytest.raises(DownloadError, match="checksum mismatch") as info:
        download_file(f"{server.url}/a.bin", dest_dir / "a.bin", sha256=expected, retries=2, backoff_s=FAST)

    corrupted = bytearray(data)
    corrupted[len(data) // 2] ^= 0xFF
    assert expected in str(info.value)
    assert sha256(bytes(corrupted)) in str(info.value)
    assert server.hits == ["a.bin"] * 3  # a mismatch is retried: the transfer may have been damaged
    assert not (dest_dir / "a.bin").exists()
    assert leftovers(dest_dir) == []


def test_one_corrupted_transfer_is_repaired_by_a_retry(server: ShardServer, dest_dir: Path) -> None:
    data = serve_bytes(server, "a.bin")
    server.script["a.bin"] = ["corrupt"]

    path = download_file(f"{server.url}/a.bin", dest_dir / "a.bin", sha256=sha256(data), backoff_s=FAST)

    assert path.read_bytes() == data
    assert server.hits == ["a.bin"] * 2


def test_connection_dropped_mid_body_leaves_nothing_and_a_retry_succeeds(server: ShardServer, dest_dir: Path) -> None:
    data = serve_bytes(server, "a.bin", size=1_000_000)
    url, dest = f"{server.url}/a.bin", dest_dir / "a.bin"

    server.script["a.bin"] = ["truncate"]
    with pytest.raises(DownloadError, match="after 1 attempts"):
        download_file(url, dest, retries=0, backoff_s=FAST)
    assert not dest.exists()
    assert leftovers(dest_dir) == []

    server.script["a.bin"] = ["truncate"]
    assert download_file(url, dest, retries=1, backoff_s=FAST).read_bytes() == data
    assert server.hits == ["a.bin"] * 3
    assert leftovers(dest_dir) == []


def test_existing_valid_file_makes_no_request(server: ShardServer, dest_dir: Path) -> None:
    data = serve_bytes(server, "a.bin")
    url, dest = f"{server.url}/a.bin", dest_dir / "a.bin"
    download_file(url, dest, backoff_s=FAST)
    assert server.hits == ["a.bin"]

    download_file(url, dest, backoff_s=FAST)
    download_file(url, dest, sha256=sha256(data), backoff_s=FAST)

    assert server.hits == ["a.bin"]
    assert dest.read_bytes() == data


def test_existing_file_with_wrong_checksum_is_fetched_again(server: ShardServer, dest_dir: Path) -> None:
    data = serve_bytes(server, "a.bin")
    dest = dest_dir / "a.bin"
    dest_dir.mkdir()
    dest.write_bytes(b"stale")

    download_file(f"{server.url}/a.bin", dest, sha256=sha256(data), backoff_s=FAST)

    assert server.hits == ["a.bin"]
    assert dest.read_bytes() == data


def test_download_shards_fetches_parquet_files_in_parallel(server: ShardServer, dest_dir: Path) -> None:
    rows = {3: 10, 0: 25, 7: 1, 1: 40, 2: 5}
    for index, count in rows.items():
        write_shard(server.root / shard_name(index), count)
    checksums = {shard_name(i): sha256((server.root / shard_name(i)).read_bytes()) for i in rows}
    server.script[shard_name(7)] = [500]
    server.delay_s = 0.2

    paths = download_shards(
        server.url + "/", list(rows), dest_dir, checksums=checksums, backoff_s=FAST, workers=4, progress=True
    )

    assert paths == [dest_dir / shard_name(i) for i in rows]
    assert [validate_parquet(p) for p in paths] == list(rows.values())
    assert server.max_in_flight > 1
    assert sorted(server.hits) == sorted([shard_name(i) for i in rows] + [shard_name(7)])
    assert leftovers(dest_dir) == []

    download_shards(server.url, list(rows), dest_dir, checksums=checksums, backoff_s=FAST)
    assert len(server.hits) == len(rows) + 1  # everything was already there


def test_download_shards_names_the_shards_that_failed(server: ShardServer, dest_dir: Path) -> None:
    write_shard(server.root / shard_name(0), 3)
    write_shard(server.root / shard_name(2), 3)

    with pytest.raises(DownloadError, match=shard_name(1)) as info:
        download_shards(server.url, [0, 1, 2], dest_dir, backoff_s=FAST)

    assert shard_name(0) not in str(info.value)
    assert validate_parquet(dest_dir / shard_name(0)) == 3
    assert validate_parquet(dest_dir / shard_name(2)) == 3
    assert not (dest_dir / shard_name(1)).exists()
    assert leftovers(dest_dir) == []


def test_validate_parquet_rejects_a_file_without_text_column(tmp_path: Path) -> None:
    path = tmp_path / "shard_00000.parquet"
    pq.write_table(pa.table({"content": ["a", "b"]}), path)

    with pytest.raises(DownloadError, match="no `text` column") as info:
        validate_parquet(path)
    assert str(path) in str(info.value)


def test_validate_parquet_rejects_non_string_text_and_non_parquet(tmp_path: Path) -> None:
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3]}), numbers)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"<html>not a parquet file</html>")

    with pytest.raises(DownloadError, match="not strings"):
        validate_parquet(numbers)
    with pytest.raises(DownloadError, match="not a readable parquet file"):
        validate_parquet(garbage)


FULL_DISK_CHILD = """
import resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, like a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
from runner.download import DownloadError, download_file
try:
    download_file(sys.argv[1], Path(sys.argv[2]), retries=3, backoff_s=0.01)
except DownloadError as error:
    print(error)
    sys.exit(3)
"""


def test_a_full_disk_fails_at_once_with_advice_and_leaves_nothing(server: ShardServer, dest_dir: Path) -> None:
    import subprocess
    import sys

    serve_bytes(server, "big.bin", size=200_000)
    dest = dest_dir / "big.bin"
    child = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, f"{server.url}/big.bin", str(dest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 3, child.stderr
    assert "Free some disk space" in child.stdout and "autoresearch prepare" in child.stdout
    assert server.hits == ["big.bin"]  # not retried: another attempt cannot help
    assert not dest.exists() and leftovers(dest_dir) == []
