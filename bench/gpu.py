"""Benchmark: the baseline train.py measured on this machine exactly as the bot measures it.

One call on a machine with an NVIDIA GPU, and nothing reachable outside it:

    bash bench/gpu.sh [--profile h100] [--runs 2] [--out bench-gpu.json]

1. Data. The profile's data is prepared with `autoresearch prepare --profile P`. For a profile
   whose data is the reference's parquet shards (h100), the download is tried first, after a short
   reachability check; when the shards cannot be fetched, stand-in shards are generated from the
   built-in corpus (its paragraphs shuffled into documents; validation paragraphs never appear in
   training) in the reference's layout, served from a local http.server, and prepared from there.
   The tokenizer is then trained on that text. val_bpb on stand-in data DOES NOT COMPARE with the
   reference's; step time, tokens/s, MFU and overheads do (they do not depend on the text). On a
   CUDA profile the same prepare fetches Flash Attention 3 (runner/kernels.py) for the sandboxed
   runs, or says why it could not (an offline machine: the runs then use SDPA).
2. Runs. `autoresearch train --profile P --json` (the isolated path: sandboxed training, scoring
   in a separate process) `--runs` times, then once more as the "warm-cache start-up" run (same
   machine, everything already loaded once), then once with `--no-sandbox` to price the sandbox.
3. Report. Per run: val_bpb, MFU, steps, tokens/s, peak memory, the attention and optimizer step
   train.py used (Flash Attention 3 or SDPA; compiled or eager), start-up, evaluation, sandbox
   set-up, overhead (total minus training) and total, beside karpathy/autoresearch's figures on an
   H100 (MFU 39.8%, val_bpb 0.9979); the GPU's name and driver from nvidia-smi. Everything goes to
   the JSON file named by --out.

A CUDA profile on a machine where torch sees no GPU stops at once, saying so. On a machine without a
GPU, `--profile smoke` (or `cpu`) runs the same code end to end in a few minutes; add `--stand-in`
to take the stand-in data path as well.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import http.server
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from runner.data import BUILTIN_CORPUS, cache_dir
from runner.download import shard_name
from runner.profiles import REFERENCE_VAL_SHARD, Profile, get_profile

# the CLI of this interpreter: its console script, or the module (a python3 given the dependencies by hand)
_SCRIPT = Path(sys.executable).parent / "autoresearch"
AUTORESEARCH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "bot.app.cli"]
# karpathy/autoresearch's README, baseline train.py on one H100 (the figures this is compared to)
REFERENCE = {
    "val_bpb": 0.9979,
    "mfu_percent": 39.8,
    "num_steps": 953,
    "overhead_s": 25.8,
    "total_s": 325.9,
    "training_s": 300.1,
    "tokens_per_second": round(953 * 2**19 / 300),  # derived: steps x batch / budget
    "peak_vram_mb": 45060.2,
    "attention": "Flash Attention 3",
    "optimizer_step": "compiled",
    "source": "karpathy/autoresearch, baseline train.py on one H100 (as quoted in issue 11)",
}
STAND_IN_PORT = 8731  # fixed, so that the stand-in's source URL (and its prepared cache) is the same each call
CHARS_PER_TOKEN = 4.5  # a generous guess for English with a BPE tokenizer of 1-8k tokens
DOC_CHARS = 1500  # stand-in documents: a few paragraphs each, at most this long and ...
DOC_CHARS_PER_SEQ = 2  # ... at most this many characters per token of a row: whole documents fill the rows

STAND_IN_LOUD = (
    "STAND-IN DATA: the runs train and score on shuffled paragraphs of the built-in corpus, not on "
    "the reference's shards. val_bpb DOES NOT COMPARE with the reference's "
    "0.9979; steps, tokens/s, MFU and the overheads do."
)


def say(line: str) -> None:
    print(line, flush=True)


# --- the machine ----------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    if shutil.which("nvidia-smi"):
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        info["nvidia_smi"] = done.stdout.strip() or done.stderr.strip()
    else:
        info["nvidia_smi"] = None
    probe = (
        "import torch; c = torch.cuda.is_available(); print(torch.__version__, torch.version.cuda, c, "
        "torch.cuda.get_device_name(0) if c else '-')"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    info["torch"] = done.stdout.strip() or done.stderr.strip()[-300:]
    info["cuda_available"] = done.returncode == 0 and done.stdout.split()[2:3] == ["True"]
    bwrap = shutil.which("bwrap")
    info["bwrap"] = (
        subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=False).stdout.strip()
        if bwrap
        else None
    )
    return info


# --- the data ---------------------------------------------------------------------------------------------


def reachable(url: str, timeout_s: float) -> str:
    """'' when the reference's first shard answers, else why not."""
    try:
        response = httpx.head(f"{url.rstrip('/')}/{shard_name(0)}", timeout=timeout_s, follow_redirects=True)
    except httpx.HTTPError as error:
        return f"{type(error).__name__}: {error}"
    return "" if response.status_code < 400 else f"HTTP {response.status_code}"


def prepare(profile: str, data: str | None, timeout_s: float) -> tuple[bool, str]:
    cmd = [*AUTORESEARCH, "prepare", "--profile", profile] + (["--data", data] if data else [])
    say(f"$ {' '.join(cmd)}")
    started = time.time()
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return False, f"prepare took longer than {timeout_s:.0f} s"
    tail = (done.stdout + done.stderr).strip()[-2000:]
    say(f"  ({time.time() - started:.0f} s) {tail}")
    return done.returncode == 0, tail


def stand_in_shards(profile: Profile, root: Path, seed: int = 0) -> dict[str, Any]:
    """Parquet shards in the reference's layout (shard_00000.. for training, the pinned validation
    shard last), generated from the built-in corpus: enough validation text for the profile's
    eval_tokens (twice over), and training text enough for its tokenizer or 10x the validation's,
    up to 200 MB, in ROOT/<profile>-<hash of these settings>. A second call does no work."""
    val_chars = int(2 * profile.eval_tokens * CHARS_PER_TOKEN)
    doc_chars = min(DOC_CHARS, DOC_CHARS_PER_SEQ * profile.seq_len)  # a row crops a longer one, wasting its rest
    train_chars = max(2_000_000, min(200_000_000, 10 * val_chars))
    n_train = max(1, profile.train_shards)
    names = [shard_name(i) for i in range(n_train)] + [shard_name(REFERENCE_VAL_SHARD)]
    per_shard = math.ceil(train_chars / n_train)
    info = {
        "train_shards": n_train,
        "doc_chars": doc_chars,
        "train_chars": per_shard * n_train,
        "val_chars": val_chars,
        "files": names,
        "made_from": str(BUILTIN_CORPUS.relative_to(ROOT)),
        "seed": seed,
    }
    info["directory"] = f"{profile.name}-{hashlib.sha256(json.dumps(info).encode()).hexdigest()[:8]}"
    directory = root / info["directory"]
    done = directory / "complete.json"
    if done.exists() and json.loads(done.read_text()) == info:
        return info
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    with gzip.open(BUILTIN_CORPUS, "rt", encoding="utf-8") as handle:
        paragraphs = [
            p
            for line in handle
            if line.strip()
            for p in json.loads(line)["text"].split("\n\n")
            if p.strip() and len(p) <= doc_chars // 2
        ]
    val_pool = paragraphs[9::10]  # every 10th paragraph is validation-only
    train_pool = [p for i, p in enumerate(paragraphs) if i % 10 != 9]
    rng = random.Random(seed)

    def documents(pool: list[str], chars: int) -> list[str]:
        docs, total = [], 0
        while total < chars:
            parts, size = [], 0
            while size < doc_chars // 2:
                parts.append(rng.choice(pool))
                size += len(parts[-1]) + 2
            docs.append("\n\n".join(parts))
            total += size
        return docs

    for name in names[:-1]:
        pq.write_table(
            pa.table({"text": pa.array(documents(train_pool, per_shard), type=pa.string())}),
            directory / name,
            row_group_size=1024,
        )
    pq.write_table(
        pa.table({"text": pa.array(documents(val_pool, val_chars), type=pa.string())}),
        directory / names[-1],
        row_group_size=1024,
    )
    done.write_text(json.dumps(info))
    return info


def serve_directory(directory: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A local http.server over `directory`, on STAND_IN_PORT if free (else any port)."""
    handler = functools.partial(QuietHandler, directory=str(directory))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", STAND_IN_PORT), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def kernel_line(prepare_output: str) -> str | None:
    """What `autoresearch prepare` said of Flash Attention 3 (a CUDA profile: fetched, or why not)."""
    return next((line for line in prepare_output.splitlines() if line.startswith("Flash Attention 3")), None)


def prepare_data(args: argparse.Namespace, profile: Profile) -> dict[str, Any]:
    """Prepare the profile's data (or the stand-in); returns what was used and why."""
    if args.data:
        ok, tail = prepare(profile.name, args.data, args.prepare_timeout)
        if not ok:
            raise SystemExit(f"gpu bench: preparing --data {args.data} failed: {tail}")
        return {"source": args.data, "stand_in": False, "flash_attention": kernel_line(tail)}
    why = "--stand-in was given"
    if not args.stand_in:
        if profile.data.startswith(("http://", "https://")):
            why = reachable(profile.data, args.download_timeout)
            if why:
                why = f"{profile.data} is not reachable ({why})"
        else:
            why = ""
        if not why:
            ok, tail = prepare(profile.name, None, args.prepare_timeout)
            if ok:
                return {"source": profile.data, "stand_in": False, "flash_attention": kernel_line(tail)}
            why = f"`autoresearch prepare --profile {profile.name}` failed: {tail[-500:]}"
    say(f"!!! {why}")
    say(f"!!! {STAND_IN_LOUD}")
    root = cache_dir() / "bench-stand-in"
    started = time.time()
    info = stand_in_shards(profile, root, args.seed)
    directory = root / info["directory"]
    say(
        f"stand-in shards in {directory} ({time.time() - started:.0f} s): {info['train_shards']} training "
        f"shard(s), {info['train_chars'] / 1e6:.1f} M chars; validation {info['val_chars'] / 1e6:.1f} M chars"
    )
    server, url = serve_directory(root)
    url = f"{url}/{info['directory']}"  # the URL names the stand-in's settings: another one is prepared afresh
    try:
        ok, tail = prepare(profile.name, url, args.prepare_timeout)
    finally:
        server.shutdown()
    if not ok:
        raise SystemExit(f"gpu bench: preparing the stand-in data failed: {tail}")
    return {
        "source": url,
        "stand_in": True,
        "why": why,
        "warning": STAND_IN_LOUD,
        "flash_attention": kernel_line(tail),
        **info,
    }


# --- the runs ---------------------------------------------------------------------------------------------


def train(
    args: argparse.Namespace, label: str, source: str | None, out: Path, budget_s: float, *, sandbox: bool = True
) -> dict[str, Any]:
    cmd = [*AUTORESEARCH, "train", "--profile", args.profile, "--json", "--out", str(out)]
    cmd += ["--data", source] if source else []
    cmd += [] if sandbox else ["--no-sandbox"]
    say(f"$ {' '.join(cmd)}    [{label}]")
    started = time.time()
    with open(out.parent / f"{out.name}.stderr.log", "w") as log:
        done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, check=False)
    wall = time.time() - started
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"status": "no result", "error": f"exit {done.returncode}, no JSON on stdout (see {log.name})"}
    timings = result.get("timings") or {}
    metrics = result.get("metrics") or {}
    total = timings.get("total")
    row = {
        "label": label,
        "exit": done.returncode,
        "status": result.get("status"),
        "error": result.get("error"),
        "val_bpb": result.get("val_bpb"),
        "mfu_percent": metrics.get("mfu_percent"),
        "num_steps": metrics.get("num_steps"),
        "tokens_per_second": metrics.get("tokens_per_second"),
        "startup_s": timings.get("startup"),
        "training_s": timings.get("training"),
        "training_wall_s": timings.get("training_wall"),
        "export_s": timings.get("export"),
        "evaluation_s": timings.get("evaluation"),
        "probe_s": timings.get("probe"),
        "sandbox_setup_s": timings.get("sandbox_setup"),
        "total_s": total,
        # as the reference counts it: everything but the training budget (start-up, compile, export, scoring)
        "overhead_s": round(total - budget_s, 3) if total is not None else None,
        "command_wall_s": round(wall, 3),
        "sandboxed": result.get("sandboxed"),
        "device": (result.get("runner") or {}).get("device"),
        "sandbox": (result.get("runner") or {}).get("sandbox"),
        "peak_vram_mb": metrics.get("peak_vram_mb"),
        # what train.py says it used (runner/kernels.py fetched Flash Attention 3 at prepare time)
        "attention": (metrics.get("extra") or {}).get("attention"),
        "optimizer_step": (metrics.get("extra") or {}).get("optimizer_step"),
        "cpu_share": metrics.get("cpu_share"),
        "run_dir": str(out),
        "result": result,
    }
    say(
        f"  {row['status']}: val_bpb {row['val_bpb']}  steps {row['num_steps']}  total {total} s"
        + (f"  ({row['error']})" if row["error"] else "")
    )
    return row


ROWS = [
    ("val_bpb", "val_bpb", "{:.4f}"),
    ("MFU %", "mfu_percent", "{:.1f}"),
    ("steps", "num_steps", "{:.0f}"),
    ("tokens/s", "tokens_per_second", "{:,.0f}"),
    ("peak memory MB", "peak_vram_mb", "{:,.0f}"),
    ("attention", "attention", "{}"),
    ("optimizer step", "optimizer_step", "{}"),
    ("start-up s", "startup_s", "{:.1f}"),
    ("training s (wall)", "training_wall_s", "{:.1f}"),
    ("export s", "export_s", "{:.1f}"),
    ("evaluation s", "evaluation_s", "{:.1f}"),
    ("sandbox set-up s", "sandbox_setup_s", "{:.2f}"),
    ("overhead s (total - budget)", "overhead_s", "{:.1f}"),
    ("total s", "total_s", "{:.1f}"),
    ("sandboxed", "sandboxed", ""),
]


def headline(runs: list[dict[str, Any]], *, stand_in: bool) -> str:
    """The measured runs' mean MFU and val_bpb against the reference's."""
    measured = [r for r in runs if r["label"].startswith("run ") and r["status"] == "ok"]
    if not measured:
        return "no measured run ended ok: nothing to compare with the reference"
    mfu = sum(r["mfu_percent"] or 0.0 for r in measured) / len(measured)
    bpb = sum(r["val_bpb"] for r in measured) / len(measured)
    caveat = " (stand-in data: val_bpb does not compare)" if stand_in else ""
    return (
        f"MFU {mfu:.1f}% against the reference's {REFERENCE['mfu_percent']}%; val_bpb {bpb:.4f} against "
        f"{REFERENCE['val_bpb']}{caveat}; over {len(measured)} measured run(s)"
    )


def short(value: Any) -> Any:
    """A table's cell: a number as it is, a sentence up to its parenthesis ("SDPA (why ...)" -> "SDPA")."""
    return value.split(" (")[0] if isinstance(value, str) else value


def table(runs: list[dict[str, Any]], reference: bool) -> str:
    heads = [r["label"] for r in runs] + (["reference (H100)"] if reference else [])
    ref = {
        "val_bpb": REFERENCE["val_bpb"],
        "mfu_percent": REFERENCE["mfu_percent"],
        "num_steps": REFERENCE["num_steps"],
        "tokens_per_second": REFERENCE["tokens_per_second"],
        "peak_vram_mb": REFERENCE["peak_vram_mb"],
        "attention": REFERENCE["attention"],
        "optimizer_step": REFERENCE["optimizer_step"],
        "training_wall_s": REFERENCE["training_s"],
        "overhead_s": REFERENCE["overhead_s"],
        "total_s": REFERENCE["total_s"],
    }
    lines = ["| | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for name, key, form in ROWS:
        cells = [form.format(short(r[key])) if isinstance(r.get(key), (int, float, str)) else "-" for r in runs]
        if key == "sandboxed":
            cells = [{True: "yes", False: "no"}.get(r.get(key), "-") for r in runs]
        if reference:
            cells.append(form.format(ref[key]) if key in ref else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h100", help="h100 on a GPU; smoke or cpu to try the script on a CPU")
    parser.add_argument("--runs", type=int, default=2, help="measured runs of the baseline (then the warm one)")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-cache start-up run")
    parser.add_argument("--no-unsandboxed", action="store_true", help="skip the run with --no-sandbox")
    parser.add_argument("--data", default=None, help="a data source to use instead of the profile's")
    parser.add_argument("--stand-in", action="store_true", help="use the stand-in data without trying the download")
    parser.add_argument("--download-timeout", type=float, default=15.0, help="seconds for the reachability check")
    parser.add_argument("--prepare-timeout", type=float, default=3600.0, help="seconds for `autoresearch prepare`")
    parser.add_argument("--seed", type=int, default=0, help="of the stand-in data")
    parser.add_argument("--runs-dir", type=Path, default=None, help="default: runs/bench-gpu-<time>")
    parser.add_argument("--prepare-only", action="store_true", help="prepare the data (or the stand-in) and stop")
    parser.add_argument("--out", type=Path, default=Path("bench-gpu.json"))
    args = parser.parse_args()
    profile = get_profile(args.profile)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs_dir = (args.runs_dir or ROOT / "runs" / f"bench-gpu-{stamp}").resolve()
    started = time.time()
    say(
        f"# bench/gpu.py {' '.join(sys.argv[1:])}  |  {time.strftime('%Y-%m-%d %H:%M')}  |  profile {profile.name} "
        f"({profile.device}, {profile.time_budget_s:.0f} s budget)  |  runs in {runs_dir}"
    )
    info = machine()
    say(f"machine: {info}")
    if profile.device == "cuda" and not info["cuda_available"]:
        raise SystemExit(
            f"gpu bench: the {profile.name} profile needs an NVIDIA GPU that torch can use, and this machine has "
            f"none (nvidia-smi: {info.get('nvidia_smi') or 'not found'}; torch: {info.get('torch')}). Run it on a "
            "GPU machine, or try the script here with --profile smoke."
        )
    runs_dir.mkdir(parents=True, exist_ok=True)
    data = prepare_data(args, profile)
    source = data["source"] if data["source"] != profile.data else None

    plan = [(f"run {i + 1}", True) for i in range(args.runs)]
    plan += [] if args.no_warm else [("warm-cache start-up", True)]
    plan += [] if args.no_unsandboxed else [("no sandbox", False)]
    plan = [] if args.prepare_only else plan
    runs = [
        train(args, label, source, runs_dir / label.replace(" ", "-"), profile.time_budget_s, sandbox=box)
        for label, box in plan
    ]

    boxed = [r for r in runs if r["sandboxed"] and isinstance(r["total_s"], float)]
    bare = [r for r in runs if r["sandboxed"] is False and isinstance(r["total_s"], float)]
    summary: dict[str, Any] = {"all_ok": all(r["status"] == "ok" for r in runs)}
    if boxed and bare:

        def mean(rows: list[dict[str, Any]], key: str) -> float:
            return sum(r[key] for r in rows) / len(rows)

        summary["sandbox_cost_s"] = {
            key: round(mean(boxed, key) - mean(bare, key), 3)
            for key in ("total_s", "overhead_s", "sandbox_setup_s", "evaluation_s")
        }
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": ["bench/gpu.py", *sys.argv[1:]],
        "profile": profile.name,
        "machine": info,
        "data": data,
        "runs": runs,
        "reference": REFERENCE,
        "summary": summary,
        "wall_s": round(time.time() - started, 1),
    }
    args.out.write_text(json.dumps(report, indent=2, default=str))

    say("")
    if data["stand_in"]:
        say(f"!!! {STAND_IN_LOUD}")
    say(f"GPU: {info.get('nvidia_smi') or 'none (nvidia-smi not found)'}; torch: {info.get('torch')}")
    say(table(runs, reference=True))
    if profile.name != "h100":
        say(f"(profile {profile.name}: the reference column is for the h100 profile; nothing here compares with it)")
    if data.get("flash_attention"):
        say(f"prepare: {data['flash_attention']}")
    for key in ("attention", "optimizer_step"):
        for said in sorted({r[key] for r in runs if r.get(key)}):
            say(f"train.py's {key.replace('_', ' ')}: {said}")
    if profile.name == "h100":
        say(headline(runs, stand_in=data["stand_in"]))
    say(
        "warm-cache start-up: the same machine with the data, tokenizer and Python files already read once; every "
        "run gets a fresh HOME and /tmp, so torch.compile's caches never carry over (Flash Attention 3 comes "
        "read-only from what prepare fetched)"
    )
    if "sandbox_cost_s" in summary:
        say(f"sandbox cost (sandboxed mean minus the unsandboxed run): {summary['sandbox_cost_s']}")
    failed = [r for r in runs if r["status"] != "ok"]
    for r in failed:
        say(f"!!! {r['label']}: {r['status']}: {r['error']}")
    say(f"wrote {args.out} ({time.time() - started:.0f} s in all)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
