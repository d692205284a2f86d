"""The kill tests' conductor process, started cheaply: one interpreter imports the conductor once,
then forks a fresh conductor process for each request, so that a test can SIGKILL one at a
failpoint and start another on the same work directory without paying for an interpreter and its
imports each time.

Run as `python conductor_forks.py TESTS_DIR` from the project's root. Each line on stdin is a JSON
request {"work": dir, "failpoint": name or null}; the forked child runs the loop in `work` through
the driver (a ScriptedAgent over work/proposals.jsonl, a FileRunner over work/runs, at most two
experiments), writes its summary to work/summary.json and its output to work/conductor.err. The
answer, one JSON line on stdout, is the child's return code as subprocess gives it (-9 when the
failpoint killed it).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the project first (cwd): tests/bot/... must not shadow bot/...
sys.path.append(sys.argv[1])  # tests/, for fakes

import scipy.special  # noqa: E402, F401  the judge imports it on first use: once here, not in every child
from fakes import IDENTITY, FileRunner  # noqa: E402

from bot.agent.scripted import ScriptedAgent  # noqa: E402
from bot.forge.local import LocalForge  # noqa: E402
from bot.loop.conductor import Conductor, ConductorConfig  # noqa: E402
from bot.loop.driver import Driver  # noqa: E402
from bot.store import Store  # noqa: E402
from bot.views.results import ResultsFile  # noqa: E402

RUN_SECONDS = 0.05  # how long a fake run lasts: it goes on while its conductor is dead
TIMER_S = 0.02  # the driver's timer: the FileRunner never announces a finished job


def run_loop(work: Path) -> None:
    store = Store(work / "state.db")
    loop = Conductor(
        store,
        LocalForge(work / "repo"),
        FileRunner(work / "runs", seconds=RUN_SECONDS),
        ScriptedAgent.from_jsonl(work / "proposals.jsonl"),
        ConductorConfig(profile="smoke", identity=IDENTITY, max_experiments=2),
        publishers=[ResultsFile(store, work / "results.tsv")],
    )
    summary = Driver(loop, timer_s=TIMER_S).run()
    counts = {"experiments": summary.experiments, "kept": summary.kept, "crashed": summary.crashed}
    (work / "summary.json").write_text(json.dumps(counts))


def child(work: Path, failpoint: str | None) -> None:
    """The forked conductor process: never returns."""
    code = 1
    try:
        output = os.open(work / "conductor.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(output, 1)  # stdout too: the answers to the test are the server's alone
        os.dup2(output, 2)
        os.environ.pop("AUTORESEARCH_FAILPOINT", None)
        if failpoint:
            os.environ["AUTORESEARCH_FAILPOINT"] = failpoint
        run_loop(work)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(Path(request["work"]), request["failpoint"])
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve()
