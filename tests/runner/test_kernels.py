"""runner.kernels: Flash Attention 3 fetched once with its files checked, and shown to a sandboxed
training process read-only and offline, where the real `kernels` package loads it. Nothing is
fetched from a hub: FakeHub lays a kernel out as the `kernels` package's download leaves it in the
Hugging Face cache."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runner import kernels, sandbox
from runner.profiles import get_profile

SANDBOX, WHY_NOT = sandbox.available()
REVISION = kernels.FLASH_ATTENTION_3_REVISION
VARIANT = "torch-cpu"  # a build for any machine with torch: the `kernels` package resolves it here
FAKE_KERNEL = {
    "metadata.json": json.dumps(
        {
            "name": "flash-attention-3",
            "id": "_fake_fa3",
            "version": 1,
            "license": "BSD-3-Clause",
            "python-depends": [],
            "backend": {"type": "cpu"},
        }
    ).encode(),
    "__init__.py": b"from types import SimpleNamespace\n"
    b"flash_attn_interface = SimpleNamespace(flash_attn_func=lambda *args, **kwargs: 'fake fa3')\n",
    "_ops.so": bytes(range(256)) * 64,  # large files are named by their sha256
}


class FakeHub:
    """`install_kernel` as the Hugging Face cache shows its work: snapshots/<revision>/build/<variant>/
    holds links to blobs/<hash> (sha256 for a large file, git blob sha1 for a small one); a blob
    already there is reused, not downloaded again. `garble` names a file whose blob arrives damaged."""

    def __init__(self, garble: str = "", times: int = 1) -> None:
        self.garble, self.garbled_left, self.calls = garble, times, 0

    def __call__(self, repo: str, revision: str, cache: Path) -> Path:
        self.calls += 1
        folder = cache / "hub" / f"kernels--{repo.replace('/', '--')}"
        variant = folder / "snapshots" / revision / "build" / VARIANT
        variant.mkdir(parents=True, exist_ok=True)
        (folder / "blobs").mkdir(exist_ok=True)
        for name, data in FAKE_KERNEL.items():
            blob = folder / "blobs" / hash_name(name, data)
            if not blob.exists():
                damaged = name == self.garble and self.garbled_left > 0
                blob.write_bytes(b"damaged in transit" if damaged else data)
                self.garbled_left -= damaged
            link = variant / name
            if not link.is_symlink():
                link.symlink_to(os.path.relpath(blob, variant))
        return variant


def hash_name(name: str, data: bytes) -> str:
    if name.endswith(".so"):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kernels"


def test_the_kernel_is_fetched_once_its_files_checked_and_recorded(cache: Path) -> None:
    hub = FakeHub()
    record, fetched = kernels.fetch_flash_attention(install=hub)
    again, fetched_again = kernels.fetch_flash_attention(install=hub)

    assert fetched and not fetched_again and hub.calls == 1
    assert again == record == json.loads((cache / kernels.RECORD).read_text())
    assert record["repo"] == "varunneal/flash-attention-3" and record["revision"] == REVISION
    assert record["variant"] == VARIANT
    assert record["files"] == {f"build/{VARIANT}/{n}": hashlib.sha256(d).hexdigest() for n, d in FAKE_KERNEL.items()}
    assert "3 files checked" in kernels.describe(record, fetched)


def test_a_file_that_does_not_match_its_hash_is_fetched_again(cache: Path) -> None:
    hub = FakeHub(garble="_ops.so")
    record, fetched = kernels.fetch_flash_attention(install=hub)
    assert fetched and hub.calls == 2  # the damaged blob was removed, so the second download wrote it afresh
    assert not kernels.check(cache, record)


def test_a_file_damaged_twice_refuses_the_kernel_and_records_nothing(cache: Path) -> None:
    with pytest.raises(kernels.KernelError, match=r"downloaded twice, and still __init__.py does not match its hash"):
        kernels.fetch_flash_attention(install=FakeHub(garble="__init__.py", times=2))
    assert not (cache / kernels.RECORD).exists()


def test_a_file_changed_after_the_fetch_is_fetched_afresh(cache: Path) -> None:
    hub = FakeHub()
    record, _ = kernels.fetch_flash_attention(install=hub)
    blob = (cache / record["snapshot"] / f"build/{VARIANT}/__init__.py").resolve()
    blob.write_bytes(b"flash_attn_interface = None\n")
    assert "__init__.py has changed since it was fetched" in kernels.check(cache, record)

    again, fetched = kernels.fetch_flash_attention(install=hub)
    assert fetched and hub.calls == 2 and again == record and not kernels.check(cache, again)


def test_a_machine_without_the_hub_gets_a_clear_error_at_once(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(kernels.KernelError, match=rf"Hugging Face Hub \(http://127.0.0.1:{port}\) is not reachable"):
        kernels.fetch_flash_attention()


def test_the_view_shows_the_fetched_kernel_offline_and_only_to_a_cuda_profile(cache: Path) -> None:
    h100, cpu = get_profile("h100"), get_profile("cpu")
    offline = {"HF_HUB_OFFLINE": "1", "KERNELS_CACHE": str(cache / "hub")}
    assert kernels.view(h100) == kernels.View(env=offline)  # nothing fetched: fails at once, offline

    record, _ = kernels.fetch_flash_attention(install=FakeHub())
    shown = kernels.view(h100)
    assert shown.read == [cache]
    assert shown.env == offline | {"LOCAL_KERNELS": f"varunneal/flash-attention-3={cache / record['snapshot']}"}
    assert kernels.view(cpu) == kernels.View()

    (cache / record["snapshot"] / f"build/{VARIANT}/_ops.so").unlink()
    assert kernels.view(h100) == kernels.View(env=offline)  # a broken copy is not shown


@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox here: {WHY_NOT}")
def test_a_sandboxed_process_loads_the_kernel_offline_and_cannot_write_to_it(cache: Path) -> None:
    pytest.importorskip("kernels")
    kernels.fetch_flash_attention(install=FakeHub())
    shown = kernels.view(get_profile("h100"))
    probe = (
        "import sys\n"
        "from kernels import get_kernel\n"
        "fa3 = get_kernel('varunneal/flash-attention-3', version=1).flash_attn_interface\n"
        "print(fa3.flash_attn_func())\n"
        f"for path in ({str(cache / kernels.RECORD)!r}, {str(cache / 'planted.py')!r}):\n"
        "    try:\n"
        "        open(path, 'a').close()\n"
        "        print('wrote', path)\n"
        "    except OSError as error:\n"
        "        print('refused', error.errno)\n"
    )
    box = sandbox.Sandbox(read=shown.read, env={"HOME": "/tmp", "PATH": "/usr/bin:/bin", **shown.env})
    done = subprocess.run(
        sandbox.wrap([sys.executable, "-c", probe], box), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["fake fa3", "refused 30", "refused 30"]  # EROFS: a read-only bind


class Stop(Exception):
    """Raised by a stand-in for sandbox.wrap once it has seen the box: no process is started."""


def test_the_supervisor_shows_the_kernel_to_training_alone(cache: Path, tmp_path: Path, monkeypatch) -> None:
    from runner import isolated

    kernels.fetch_flash_attention(install=FakeHub())
    boxes: list[sandbox.Sandbox] = []

    def seen(argv: list[str], box: sandbox.Sandbox) -> list[str]:
        boxes.append(box)
        raise Stop

    monkeypatch.setattr(isolated.sandbox, "wrap", seen)
    supervisor = isolated.Supervisor(tmp_path / "run", "h100", use_sandbox=True)
    supervisor.sandboxed, supervisor.profile = True, get_profile("h100")
    for start in (lambda: supervisor._start_trainer(get_profile("h100")), supervisor._spawn_scorer):
        with pytest.raises(Stop):
            start()
    trainer, scorer = boxes
    assert cache in trainer.read and cache not in trainer.write
    assert trainer.env["HF_HUB_OFFLINE"] == "1" and trainer.env["LOCAL_KERNELS"].startswith(
        f"{kernels.FLASH_ATTENTION_3}="
    )
    assert cache not in scorer.read and "LOCAL_KERNELS" not in scorer.env  # it scores an SDPA graph


def test_a_failed_download_is_told_by_its_exception_and_the_builds_it_refused() -> None:
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "<string>", line 3, in <module>\n'
        "FileNotFoundError: Cannot find a build variant for this system in varunneal/flash-attention-3:\n"
        "\n"
        "- torch29-cxx11-cu128-x86_64-linux: rejected: Torch version (2.9) does not match (2.13)\n"
    )
    assert kernels.error_line(stderr) == (
        "FileNotFoundError: Cannot find a build variant for this system in varunneal/flash-attention-3: "
        "- torch29-cxx11-cu128-x86_64-linux: rejected: Torch version (2.9) does not match (2.13)"
    )
    assert kernels.error_line("killed\n") == "killed"
