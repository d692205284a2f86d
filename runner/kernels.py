"""Flash Attention 3 for the sandboxed training process: fetched once by `autoresearch prepare`,
checked, and shown to every run read-only and offline.

The sandbox has no network, so train.py's `get_kernel(...)` cannot download the kernel itself.
Instead, preparing a CUDA profile (runner.prepare) fetches one pinned revision of the kernel with
the `kernels` package's own download (`install_kernel`, the build variant for this machine's
torch and CUDA) into `$AUTORESEARCH_CACHE/kernels`, the package's cache (KERNELS_CACHE) there. The
download's files are then checked: each one the Hub names by its hash (the Hugging Face cache keeps
a file as blobs/<sha256>, or blobs/<git sha1> for a small one) must have that hash, and the
sha256 of every file is recorded in `flash-attention-3.json` beside the cache. A later prepare
checks them again and fetches afresh what no longer matches.

`view(profile)` says what the training process of a run then sees: the kernels directory
read-only, `LOCAL_KERNELS=<repo>=<the fetched snapshot>` (the `kernels` package resolves that
repository from the directory, whatever version train.py asks for) and `HF_HUB_OFFLINE=1` (nothing
else is looked up on the Hub; a kernel that was never fetched fails at once, and train.py falls back
to PyTorch's SDPA and says why). The scoring process needs no kernel: train.py's exported graph uses
SDPA (runner.handoff scores PyTorch operators only).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runner.data import cache_dir
from runner.profiles import Profile

# varunneal's Flash Attention 3 build for Hopper, the kernel karpathy/autoresearch loads on an H100,
# at one fixed revision (the commit other public projects pin for it)
FLASH_ATTENTION_3 = "varunneal/flash-attention-3"
FLASH_ATTENTION_3_REVISION = "de87b9b5af06dd9984df595bef90b2eba44b181a"
RECORD = "flash-attention-3.json"
FETCH_TIMEOUT_S = 3600.0  # a build is a few hundred MB
REACH_TIMEOUT_S = 10.0
HASH_NAME = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt): ")
# The `kernels` package's own download, in a process of its own: it reads KERNELS_CACHE when imported.
# The pinned repository is trusted by name (its publisher's trust cannot be looked up offline later).
INSTALL_SCRIPT = (
    "import sys\n"
    "from kernels import install_kernel\n"
    "print(install_kernel(sys.argv[1], revision=sys.argv[2], trust_remote_code=[sys.argv[1]]))\n"
)


class KernelError(RuntimeError):
    """The kernel could not be fetched or its files do not check out."""


@dataclass
class View:
    """What a sandboxed training process sees of the kernels: read-only paths and environment."""

    read: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


Installer = Callable[[str, str, Path], Path]  # (repo, revision, kernels cache) -> the variant's directory


def kernels_dir() -> Path:
    """The `kernels` package's cache (KERNELS_CACHE) for the runs: under the data cache."""
    return cache_dir() / "kernels"


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def install_with_kernels(repo: str, revision: str, cache: Path) -> Path:
    """Download the build of `repo` at `revision` for this machine with the `kernels` package, after a
    quick look that the Hub answers at all (else its client retries for most of a minute)."""
    import httpx  # here: the supervisor imports this module for view() alone

    try:
        httpx.head(hub_endpoint(), timeout=REACH_TIMEOUT_S)
    except httpx.HTTPError as error:
        raise KernelError(f"the Hugging Face Hub ({hub_endpoint()}) is not reachable from here ({error})") from None
    env = dict(os.environ, KERNELS_CACHE=str(cache / "hub"))
    env.pop("HF_HUB_OFFLINE", None)
    try:
        done = subprocess.run(
            [sys.executable, "-c", INSTALL_SCRIPT, repo, revision],
            capture_output=True,
            text=True,
            env=env,
            timeout=FETCH_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise KernelError(f"downloading {repo} took more than {FETCH_TIMEOUT_S:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise KernelError(f"the kernels package could not fetch {repo}@{revision[:12]}: {error_line(done.stderr)}")
    return Path(lines[-1])


def error_line(stderr: str) -> str:
    """A Python traceback's exception in one line: from the line naming it ("FileNotFoundError: Cannot
    find a build variant ...") to the end of its message (which builds were refused, and why)."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()] or ["no output"]
    named = [i for i, line in enumerate(lines) if EXCEPTION_LINE.match(line)]
    return " ".join(lines[named[-1] if named else -1 :])[:500]


def fetch_flash_attention(
    *,
    install: Installer | None = None,
    repo: str = FLASH_ATTENTION_3,
    revision: str = FLASH_ATTENTION_3_REVISION,
) -> tuple[dict[str, object], bool]:
    """Fetch the pinned kernel into kernels_dir() unless it is there and checks out: (its record,
    fetched now). Files that do not check out are removed and fetched once more; a second failure
    raises KernelError."""
    install = install or install_with_kernels
    cache = kernels_dir()
    record = read_record(cache)
    if record and record.get("repo") == repo and record.get("revision") == revision:
        if not check(cache, record):
            return record, False
        remove_repo(cache, cache / str(record.get("snapshot", "")))  # changed since: fetch it afresh
    for _ in range(2):
        variant = install(repo, revision, cache)
        snapshot = variant.parent.parent  # <snapshot>/build/<variant>
        if cache.resolve() not in snapshot.resolve().parents:
            raise KernelError(
                f"the kernels package put {repo} in {variant}, outside {cache}: a sandbox could not see it"
            )
        bad = check_hash_names(variant)
        if not bad:
            record = {
                "repo": repo,
                "revision": revision,
                "variant": variant.name,
                "snapshot": str(snapshot.relative_to(cache)),
                "files": {str(p.relative_to(snapshot)): sha256(p) for p in files_under(variant)},
            }
            (cache / RECORD).write_text(json.dumps(record, indent=2) + "\n")
            return record, True
        remove_repo(cache, snapshot)  # else the second download would reuse what failed the check
    raise KernelError(f"{repo}@{revision[:12]} was downloaded twice, and still {bad[0]}")


def read_record(cache: Path) -> dict[str, object] | None:
    try:
        record = json.loads((cache / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def check(cache: Path, record: dict[str, object], *, full: bool = True) -> str:
    """'' when every recorded file is there with its recorded sha256 (full) or size (not full), else
    what is wrong."""
    snapshot = cache / str(record.get("snapshot", ""))
    listed = record.get("files")
    if not isinstance(listed, dict) or not listed:
        return f"{RECORD} lists no files"
    for name, digest in listed.items():
        path = snapshot / name
        if not path.is_file():
            return f"{name} is missing"
        if full and sha256(path) != digest:
            return f"{name} has changed since it was fetched (sha256 {sha256(path)[:12]}, recorded {str(digest)[:12]})"
    return ""


def check_hash_names(variant: Path) -> list[str]:
    """Files whose content does not have the hash their cached name (blobs/<hash>) gives: sha256 for
    a large file, the git blob sha1 for a small one. Files not named by a hash are not checked here."""
    bad = []
    for path in files_under(variant):
        name = path.resolve().name
        if not HASH_NAME.match(name):
            continue
        actual = sha256(path) if len(name) == 64 else git_blob_sha1(path)
        if actual != name:
            bad.append(f"{path.relative_to(variant)} does not match its hash ({actual[:12]}, named {name[:12]})")
    return bad


def view(profile: Profile) -> View:
    """What the training process of a run on `profile` sees of the kernels (nothing on a CPU)."""
    if profile.device != "cuda":
        return View()
    cache = kernels_dir()
    env = {"HF_HUB_OFFLINE": "1", "KERNELS_CACHE": str(cache / "hub")}
    record = read_record(cache)
    if record is None or check(cache, record, full=False):  # sizes and names only: the hashes are prepare's
        return View(env=env)
    snapshot = cache / str(record["snapshot"])
    env["LOCAL_KERNELS"] = f"{record['repo']}={snapshot}"
    return View(read=[cache], env=env)


def describe(record: dict[str, object], fetched: bool) -> str:
    verb = "fetched" if fetched else "already fetched"
    count = len(record.get("files") or {})  # type: ignore[arg-type]
    return (
        f"Flash Attention 3: {record['repo']}@{str(record['revision'])[:12]} ({record['variant']}), {verb}, "
        f"{count} files checked, in {kernels_dir()}"
    )


def files_under(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def remove_repo(cache: Path, snapshot: Path) -> None:
    """Remove one repository's folder of the Hugging Face cache (<cache>/hub/<kind>s--<owner>--<name>,
    two levels above its snapshots/<revision>); nothing outside `cache`."""
    folder = snapshot.parent.parent
    if cache.resolve() in folder.resolve().parents and folder.name.count("--") >= 2:
        shutil.rmtree(folder, ignore_errors=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_blob_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
