"""The isolated path against a hostile train.py: every attack ends rejected or crashed, or the
number stays honest, and the runner serves the next job afterwards. Plus each way a run can fail.

Runs go through `run_job` (the supervisor every runner uses) on the smoke profile, with a tiny
model so that a run costs seconds. Where a test needs a shorter limit than the profile's, the
supervisor's copy of the profile is changed (the supervisor enforces limits; the training
process never sees them).

The attacks on the machine and on the reported number share one run (`attacked`): its train.py
tries each in turn, says what it could do, and hands over its model; then the same path runs an
honest job, in a warm worker renamed to its run's directory as the local runner does (the cold run
is the attacks'). Two runs for all of them, in `make test`. Each attack that needs a run of its own
(a model the scorer must refuse, a clock or a limit that ends the run) is in the slow tier; the
scorer's verdict on each refused model is pinned in this process by tests/runner/test_score.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile import escape, marked, sleeper

from runner import profiles, sandbox
from runner.isolated import Supervisor, run_job
from runner.protocol import JobSpec, ResultSpec

pytestmark = pytest.mark.skipif(not sandbox.available()[0], reason=f"no sandbox here: {sandbox.available()[1]}")

# A model that learns nothing on purpose: its val_bpb is near the uniform one (about 4 on the
# smoke profile), far above anything a trained model or a fake could claim.
HEADER = """
import torch
from runner import harness
h = harness.session()

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(h.vocab_size, 8)
        self.out = torch.nn.Linear(8, h.vocab_size)
    def forward(self, idx):
        return self.out(self.embed(idx))

model = Tiny()
torch.nn.init.zeros_(model.out.weight)
torch.nn.init.zeros_(model.out.bias)
"""
HONEST_FLOOR = 3.0  # val_bpb of the untrained Tiny is log2(1024) * tokens / bytes, about 4
READY_S = 300.0  # a generous bound for importing torch on a busy machine; never reached when all is well
MARK = "autoresearch-attack-marker"


def run(tmp_path: Path, body: str, name: str = "run", **options) -> ResultSpec:
    job = JobSpec(run_id=1, asset=HEADER + body, profile="smoke", seed=0)
    return run_job(job, tmp_path / name, threads=1, **options)


def log(tmp_path: Path, name: str = "run") -> str:
    return (tmp_path / name / "log.txt").read_text(errors="replace")


def serves_next_job(tmp_path: Path, *, scored: bool = False) -> None:
    """After an attack, the same path runs the next job: to a real result when `scored` (for the
    attacks on files the scorer reads), else to the crash of a job that stops at once (seconds)."""
    if scored:
        result = run(tmp_path, "h.finish(model)\n", name="next")
        assert result.status == "ok" and result.val_bpb is not None and result.val_bpb > HONEST_FLOOR, result.error
    else:
        result = run(tmp_path, "raise SystemExit('the next job')\n", name="next")
        assert result.status == "crash" and "the next job" in result.error and result.sandboxed
    assert not leftover_processes()


def leftover_processes() -> list[int]:
    return marked(MARK)


@pytest.fixture
def short_limits(monkeypatch: pytest.MonkeyPatch):
    """Set the supervisor's limits for the smoke profile: (hard wall limit, allowance beyond the budget)."""

    def set_limits(max_total_s: float | None = None, allowance_s: float | None = None) -> None:
        smoke = profiles.PROFILES["smoke"]
        changed = dataclasses.replace(
            smoke, max_total_s=max_total_s or smoke.max_total_s, allowance_s=allowance_s or smoke.allowance_s
        )
        monkeypatch.setitem(profiles.PROFILES, "smoke", changed)

    return set_limits


# --- one run of every attack that leaves the run going, then an honest job -----------------------

SECRET = "ghp_" + "s3cr3t" * 6
SECRET_FILES = (".netrc", ".config/gh/hosts.yml", ".aws/credentials", "project/.env", "state/app-key.pem")
FAKE_RESULT = json.dumps({"status": "ok", "val_bpb": 0.1})
LATE_MARK = "autoresearch-late-writer-marker"  # not MARK: escape(MARK) counts its own three processes


@dataclasses.dataclass
class Attacked:
    directory: Path  # run/: the attacks' run; next/: the honest job after it
    result: ResultSpec  # the attacks' run, which hands over the untrained model at its end
    log: str
    next: ResultSpec  # the honest job the same path ran right after, in a renamed warm worker
    accepted: list[object]  # connections the host's loopback accepted from the attacks' run
    harness_before: bytes  # runner/evaluate.py before the run


def attacks(directory: Path, *, val_file: Path, evaluate: Path, home: Path, port: int) -> str:
    """train.py after HEADER: each attack in turn, each saying what it could do, none stopping the
    others; then h.finish(model)."""
    late = (
        f"import time, pathlib; time.sleep(3); "
        f"pathlib.Path({str(directory / 'run' / 'result.json')!r}).write_text({FAKE_RESULT!r})"
    )
    secret_paths = [str(home / name) for name in SECRET_FILES] + ["/root/.netrc", "/proc/1/environ"]
    return f"""
import json, os, socket, subprocess, sys
from pathlib import Path

# the validation split
val = Path({str(val_file)!r})
print("val exists:", val.exists(), flush=True)
try:
    next(h.dataset.document_batches("val"))
except Exception as error:
    print("val read failed:", type(error).__name__, flush=True)
print("train exists:", all(p.exists() for p in h.dataset.paths("train")), flush=True)

# the harness's files
try:
    Path({str(evaluate)!r}).write_text("def evaluate_bpb(*a, **k): return 0.01\\n")
    print("harness edited", flush=True)
except OSError as error:
    print("harness edit failed:", type(error).__name__, flush=True)

# secrets in the environment and in files
print("environment:", sorted(os.environ), flush=True)
print("leaked:", [k for k, v in os.environ.items() if {SECRET!r} in v], flush=True)
for path in map(Path, {secret_paths!r}):
    try:
        print("read", path, {SECRET!r} in path.read_text(errors="replace"), flush=True)
    except OSError as error:
        print("unreadable", path, type(error).__name__, flush=True)

# the network: the host's loopback, and the internet
for host in ("127.0.0.1", "pypi.org"):
    try:
        socket.create_connection((host, {port} if host == "127.0.0.1" else 443), timeout=3).close()
        print("connected to", host, flush=True)
    except OSError as error:
        print("no connection to", host, type(error).__name__, flush=True)

# result.json, written by train.py and by a detached child once the run has ended
here = Path.cwd()
for target in (here / "result.json", here.parent / "result.json", Path(h.out_dir) / "result.json"):
    try:
        target.write_text({FAKE_RESULT!r})
        print("wrote", target, flush=True)
    except OSError as error:
        print("could not write", target, type(error).__name__, flush=True)
subprocess.Popen([sys.executable, "-c", {late!r}, "{LATE_MARK}"], start_new_session=True)

# the loss and the evaluation, patched in this process
import runner.evaluate, runner.harness
class Fake:
    val_bpb, tokens, bytes = 0.01, 1, 1
runner.evaluate.evaluate_bpb = lambda *args, **kwargs: Fake()
runner.harness.evaluate_bpb = runner.evaluate.evaluate_bpb
h.step_done(0.0)
print("evaluation patched", flush=True)

# a summary block of its own
print('---\\nval_bpb:          0.100000\\n', flush=True)
{escape(MARK)}
h.finish(model)

# claims of its own, written over the harness's: the parameters' fingerprint decides pairing
claims_file = Path(h.out_dir) / "claims.json"
claims_file.write_text(json.dumps(dict(json.loads(claims_file.read_text()), params_fingerprint="forged")))
print("claims forged", flush=True)
"""


@pytest.fixture(scope="module")
def attacked(smoke_prepared, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attacked]:
    """One run whose train.py tries every attack of the tests below (each is tried whatever came
    of the others, and prints what it could do), with secrets in the supervisor's environment and
    home and a listener on the host's loopback; then an honest job on the same path."""
    directory = tmp_path_factory.mktemp("attacked")
    dataset = smoke_prepared.dataset
    evaluate = Path(profiles.__file__).parent / "evaluate.py"
    home = directory / "home"
    for relative in SECRET_FILES:
        (home / relative).parent.mkdir(parents=True, exist_ok=True)
        (home / relative).write_text(f"token {SECRET}\n")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[object] = []
    stopped = threading.Event()

    def accept() -> None:
        while not stopped.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    before = evaluate.read_bytes()
    body = attacks(
        directory, val_file=dataset.root / dataset.val_file, evaluate=evaluate, home=home, port=server.getsockname()[1]
    )
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name in ("GITHUB_TOKEN", "ANTHROPIC_API_KEY", "AUTORESEARCH_WEBHOOK_SECRET"):
                patch.setenv(name, SECRET)
            patch.setenv("HOME", str(home))
            result = run(directory, body)
    finally:
        stopped.set()
        listener.join(timeout=5)
        server.close()
    yield Attacked(
        directory=directory,
        result=result,
        log=log(directory),
        next=run_warm_renamed(directory / "worker", directory / "next", HEADER + "h.finish(model)\n"),
        accepted=accepted,
        harness_before=before,
    )


def run_warm_renamed(worker_dir: Path, run_dir: Path, asset: str) -> ResultSpec:
    """A warm worker's run, as the local runner makes one: a supervisor prepared before its job (its
    processes ready, torch imported), its directory renamed to the run's when the job comes."""
    worker = Supervisor(worker_dir, "smoke", threads=1)
    worker.prepare()
    assert worker.wait_ready(READY_S), "the worker's processes never said they were ready"
    os.rename(worker_dir, run_dir)
    return worker.run(JobSpec(run_id=1, asset=asset, profile="smoke", seed=3), out=run_dir)


def test_an_honest_run_is_scored_outside_the_sandbox(attacked: Attacked, smoke_prepared) -> None:
    """The honest job the path ran right after the attacks, in a warm worker whose directory was
    renamed to the run's: nothing of the attacks carried over, and the sandboxed processes, which
    see the directory at its old path, noticed nothing of the rename (the unsandboxed ones, which
    see it: tests/runner/test_isolated_warm.py)."""
    result, run_dir = attacked.next, attacked.directory / "next"
    assert result.status == "ok" and result.sandboxed and result.runner.sandbox.startswith("bubblewrap"), result.error
    assert result.val_bpb > HONEST_FLOOR
    assert "causal" in result.metrics["probe"]
    assert result.hashes.data == smoke_prepared.dataset.fingerprint and result.seed == 3
    assert result.timings.evaluation > 0 and result.timings.training_wall > 0
    assert result.metrics["warm"] is True  # its training process had imported torch when the job came
    assert result.metrics["ready_cpu_seconds"] > 0  # and that CPU time is not the run's
    stored = ResultSpec.model_validate_json((run_dir / "result.json").read_text())
    assert stored == result
    text = (run_dir / "log.txt").read_text()
    assert "WARNING: running train.py WITHOUT a sandbox" not in text
    assert "[harness] ready" not in text  # the supervisor's signal, not train.py's output
    assert (run_dir / "asset" / "train.py").read_text() == HEADER + "h.finish(model)\n"
    assert not list(attacked.directory.rglob("model.pt2")), "a scored model is not kept (hundreds of MB on a GPU)"
    assert not leftover_processes()


# --- attacks on the number ------------------------------------------------------------------------


def test_a_fake_summary_block_is_not_read(attacked: Attacked) -> None:
    assert "(train.py printed) val_bpb:          0.100000" in attacked.log  # marked as train.py's own words
    assert [line for line in attacked.log.splitlines() if line.startswith("val_bpb:")] == [
        f"val_bpb:          {attacked.result.val_bpb:.6f}"
    ], "the only unmarked val_bpb line is the scorer's"
    assert attacked.result.status == "ok" and attacked.result.val_bpb > HONEST_FLOOR, attacked.result.error


def test_result_json_written_by_train_py_or_a_detached_child_is_not_read(attacked: Attacked) -> None:
    assert "wrote" in attacked.log or "could not write" in attacked.log
    assert attacked.result.status == "ok" and attacked.result.val_bpb > HONEST_FLOOR, attacked.result.error
    # Under /tmp the path resolves in the sandbox's private /tmp: a write there lands nowhere real.
    assert not marked(LATE_MARK), "the detached child died with the sandbox"
    stored = ResultSpec.model_validate_json((attacked.directory / "run" / "result.json").read_text())
    assert stored.val_bpb == attacked.result.val_bpb


def test_a_forged_parameters_fingerprint_is_not_read(attacked: Attacked) -> None:
    """Whether a change is judged seed for seed with main rests on its parameters' fingerprint: the
    scorer's, never what train.py wrote into its claims."""
    assert "claims forged" in attacked.log
    fingerprint = attacked.result.metrics["params_fingerprint"]
    assert fingerprint != "forged" and len(fingerprint) == 16 and int(fingerprint, 16) >= 0


def test_patching_the_loss_and_the_evaluation_changes_nothing(attacked: Attacked) -> None:
    assert "evaluation patched" in attacked.log
    assert attacked.result.status == "ok" and attacked.result.val_bpb > HONEST_FLOOR, attacked.result.error


@pytest.mark.slow
def test_a_patched_clock_that_trains_past_the_budget_is_rejected(smoke_prepared, tmp_path: Path, short_limits) -> None:
    """Slow tier: it trains until the supervisor's real CPU clock reaches a 9 s cap, which only a
    run of that length can show (the quicker clock attacks of test_budget.py run in `make test`)."""
    short_limits(allowance_s=6.0)  # a cap of 9 s; more ways around the harness's clock: test_budget.py
    body = """
import time
h._cpu_clock = lambda: 0.0  # the harness's clock stands still...
start = time.process_time()
while time.process_time() - start < 15.0:  # ...while this trains for 15 CPU seconds
    x = torch.randn(256, 256)
    x @ x
    h.step_done(1.0)
h.finish(model)
"""
    result = run(tmp_path, body)
    assert result.status == "rejected", result
    assert "past the budget" in result.error and result.val_bpb is None
    assert 9.0 <= result.metrics["training_seconds"] < 15.0, "stopped at its cap, not at its own end"
    serves_next_job(tmp_path)


@pytest.mark.slow
def test_a_model_that_reads_later_tokens_is_rejected(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: a refused model through the whole path (export in the sandbox, the scoring
    process, the supervisor's verdict) needs a run of its own; each refusal is pinned in this
    process, in `make test`, by tests/runner/test_score.py."""
    body = """
class Peek(torch.nn.Module):
    def forward(self, idx):
        following = torch.roll(idx, shifts=-1, dims=1)  # the token each position must predict
        return 30.0 * torch.nn.functional.one_hot(following, h.vocab_size).float()
h.finish(Peek())
"""
    result = run(tmp_path, body)
    assert result.status == "rejected" and "reads future tokens" in result.error
    serves_next_job(tmp_path)


# --- attacks on the machine ---------------------------------------------------------------------------


def test_the_validation_split_is_not_visible(attacked: Attacked) -> None:
    assert "val exists: False" in attacked.log and "val read failed:" in attacked.log
    assert "train exists: True" in attacked.log


def test_the_harness_files_cannot_be_changed(attacked: Attacked) -> None:
    evaluate = Path(profiles.__file__).parent / "evaluate.py"
    assert "harness edit failed:" in attacked.log and evaluate.read_bytes() == attacked.harness_before
    assert attacked.result.status == "ok" and attacked.result.val_bpb > HONEST_FLOOR, attacked.result.error


def test_secrets_are_not_reachable(attacked: Attacked) -> None:
    text = attacked.log
    assert SECRET not in text and "leaked: []" in text
    assert "GITHUB_TOKEN" not in text and "ANTHROPIC_API_KEY" not in text
    assert text.count("unreadable") >= 6
    assert " True" not in "\n".join(line for line in text.splitlines() if line.startswith("read "))


def test_no_network_connection_can_be_opened(attacked: Attacked) -> None:
    assert "no connection to 127.0.0.1" in attacked.log and "no connection to pypi.org" in attacked.log
    assert not attacked.accepted, "the host's loopback is another network"


def test_no_process_outlives_its_run(attacked: Attacked) -> None:
    assert "escaped" in attacked.log and attacked.result.status == "ok"  # all three were running when it ended
    assert not leftover_processes()


@pytest.mark.slow
def test_training_in_a_child_process_counts_on_the_clock(smoke_prepared, tmp_path: Path, short_limits) -> None:
    """Slow tier: the child must train until the supervisor's real CPU clock reaches a 9 s cap."""
    short_limits(allowance_s=6.0)
    body = """
import os, subprocess, sys, time
work = ("import time, pathlib\\nstart = time.process_time()\\nwhile time.process_time() - start < 15: pass\\n"
        "pathlib.Path('done').write_text('')")
subprocess.Popen([sys.executable, "-c", work])  # 15 CPU seconds the harness's clock never sees, never waited for
while not os.path.exists("done"):
    time.sleep(0.1)
h.finish(model)
"""
    result = run(tmp_path, body)
    assert result.status == "rejected" and "past the budget" in result.error
    serves_next_job(tmp_path)


# --- ways a run fails ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("raise KeyError('no such knob')\n", "KeyError: 'no such knob'"),
        ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
        ("import ctypes\nctypes.string_at(0)\n", "SIGSEGV"),
        ("x = torch.empty(1 << 50, dtype=torch.uint8)\n", "alloc"),
        (
            "class Weird(torch.nn.Module):\n    def forward(self, idx):\n        if idx.sum() > 0:\n"
            "            return model(idx)\n        return model(idx) * 2\nh.finish(Weird())\n",
            "exported",
        ),
    ],
)
def test_a_failing_run_is_a_crash_that_says_why(smoke_prepared, tmp_path: Path, body: str, expected: str) -> None:
    """Slow tier: each way to fail is a run of its own (a crash through the isolated path runs in
    `make test` as tests/bot/runners/test_local.py's test_a_crash_is_a_result_with_the_error)."""
    result = run(tmp_path, body)
    assert result.status == "crash" and expected.lower() in result.error.lower(), result.error
    assert result.val_bpb is None and result.log_tail is not None
    serves_next_job(tmp_path)


@pytest.mark.slow
def test_an_endless_loop_is_killed_at_the_hard_limit(
    smoke_prepared, tmp_path: Path, short_limits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow tier: the run must last until the wall-clock hard limit, 8 s after its start."""
    short_limits(max_total_s=8.0)  # a loop that sleeps: a busy one would meet its CPU cap (rejected) first
    result = run(
        tmp_path, f"import subprocess, sys, time\nsubprocess.Popen({sleeper(MARK)})\nwhile True:\n    time.sleep(0.1)\n"
    )
    assert result.status == "timeout" and "hard limit" in result.error
    assert not leftover_processes()
    monkeypatch.undo()  # the next job runs under the profile's own limits, however busy this machine is
    serves_next_job(tmp_path)


@pytest.mark.slow
def test_a_flood_of_output_is_capped(smoke_prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow tier: a run of its own that floods its output (the cap itself: tests/runner/test_run_log.py)."""
    monkeypatch.setattr("runner.run_log.LOG_LIMIT_BYTES", 100_000)
    flood = "import sys\nfor _ in range(20000):\n    sys.stdout.write('x' * 100 + '\\n')\nh.finish(model)\n"
    result = run(tmp_path, flood)
    assert result.status == "ok"
    size = (tmp_path / "run" / "log.txt").stat().st_size
    assert 100_000 <= size < 101_000 and "log cut at 100000 bytes" in log(tmp_path)


@pytest.mark.slow
def test_a_link_planted_in_scratch_is_not_followed(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: a run of its own that ends without a model (the reader that refuses links:
    tests/runner/test_files.py)."""
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"status": "exported", "error": "SECRET-VALUE"}))
    body = f"""
import os
os.symlink({str(secret)!r}, "claims.json")
os.symlink({str(secret)!r}, "progress.jsonl")
os.symlink({str(secret)!r}, "model.pt2")
"""
    progress: list[dict] = []
    result = run(tmp_path, body, on_progress=progress.append)
    assert result.status == "crash" and "SECRET-VALUE" not in (result.error or "") and not progress
    serves_next_job(tmp_path, scored=True)


@pytest.mark.slow
def test_without_a_sandbox_the_run_is_marked_and_warned(smoke_prepared, tmp_path: Path) -> None:
    """Slow tier: one more cold run, unsandboxed (the warm worker's unsandboxed run in
    tests/runner/test_isolated_warm.py checks the same mark and warning in `make test`)."""
    result = run(tmp_path, "h.finish(model)\n", use_sandbox=False)
    assert result.status == "ok" and not result.sandboxed and result.runner.sandbox == "none"
    assert "WARNING: running train.py WITHOUT a sandbox" in log(tmp_path)


def test_a_cuda_slot_sees_its_own_gpu_only(tmp_path: Path) -> None:
    argv = sandbox.wrap(["python"], sandbox.Sandbox(gpus=["5"], env={"CUDA_VISIBLE_DEVICES": "5"}))
    binds = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dev-bind-try"]
    assert "/dev/nvidia5" in binds and not any(
        b.startswith("/dev/nvidia") and b[11:].isdigit() and b != "/dev/nvidia5" for b in binds
    )
    assert "/dev/nvidiactl" in binds
    assert argv[argv.index("--setenv") + 1 : argv.index("--setenv") + 3] == ["CUDA_VISIBLE_DEVICES", "5"]
    assert os.path.exists("/dev/null")


def test_sandboxed_processes_of_a_cpu_profile_let_waiting_threads_sleep(tmp_path: Path) -> None:
    # Spinning OpenMP threads slow the scorer down twice over on a busy machine (docs/benchmarks.md).
    from runner.isolated import Supervisor

    supervisor = Supervisor(tmp_path, "smoke")
    env = supervisor._env(profiles.get_profile("smoke"), home=tmp_path)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert "OMP_WAIT_POLICY" not in supervisor._env(profiles.get_profile("h100"), home=tmp_path)
