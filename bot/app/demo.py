"""The local loop, wired up: a research repository on disk, the CPU, the offline explorer.

`autoresearch demo` builds (or reopens) a work directory

    <workdir>/repo/        the research repository (main holds the best measured train.py, or the
                           asset of the task it runs: `--task`, runner.tasks)
    <workdir>/state.db     the store
    <workdir>/runs/<id>/   one directory per training run (train.py, log.txt, result.json)
    <workdir>/results.tsv  the reference's results table
    <workdir>/conductor.log

and drives the conductor over it (bot.loop.driver) with a live display in a terminal, and one printed
line per event either way (so `make demo > file`, CI and nohup show progress). A work directory
measures one profile and one task. Running it again resumes; `autoresearch steer/pause/resume`
reach it while it runs, through the store's inbox.

A task other than training starts from the starter files in its evaluator's package directory (its
asset and program.md, e.g. runner/tasks/ticket_routing/router.py), prepares that task's inputs and
pins its identity (runner.tasks.run). The offline explorer tunes the constants of train.py and
router.py and the indexes of query.sql; a task whose asset has neither needs the scripted agent or
Claude (`check_agent_for_task`).
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import git
from rich.console import Console
from rich.live import Live
from rich.table import Table

from bot.agent.choice import make_agent
from bot.forge.local import init_research_repo
from bot.loop import measurement
from bot.loop.conductor import Conductor, ConductorConfig, Summary
from bot.loop.driver import Driver
from bot.loop.program import SettingsError, parse_program
from bot.runners.local import LocalRunner
from bot.store import Store
from bot.views import results
from bot.views.read_model import conductor_live, shown_value, view_of
from bot.views.terminal import render_live_progress
from bot.views.text import places
from runner.identity import measurement_identity
from runner.prepare import prepare
from runner.profiles import get_profile
from runner.tasks import DEFAULT_TASK, TRAINING, Metric, get_task
from runner.tasks.run import prepare_task, task_identity

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SEED_FILES = ("train.py", "program.md")


@dataclass
class DemoOptions:
    workdir: Path
    profile: str = "cpu"
    experiments: int = 6
    slots: int = 1
    seed: int = 0
    data: str | None = None
    live: bool = True
    agent: str = "explorer"  # explorer | claude | scripted (bot.agent.choice)
    agent_script: Path | None = None
    budget_usd: float | None = None  # overrides AUTORESEARCH_ANTHROPIC_BUDGET_USD
    dashboard_port: int | None = 8090  # None: no dashboard; a taken port: any free one
    task: str = DEFAULT_TASK  # runner.tasks: what the research repository's main holds and the loop measures


def seed_files(task: str = DEFAULT_TASK) -> dict[str, str]:
    """The asset (train.py for training) and program.md a new research repository starts from: the
    project's own for training, the starter files beside the task's evaluator for another task."""
    if task != DEFAULT_TASK:
        return _starter_files(task)
    missing = [name for name in SEED_FILES if not (PROJECT_ROOT / name).exists()]
    if missing:
        raise FileNotFoundError(
            f"{', '.join(missing)} not found next to the bot package in {PROJECT_ROOT}: "
            "run autoresearch from a clone of the autoresearch-bot repository"
        )
    return {name: (PROJECT_ROOT / name).read_text(encoding="utf-8") for name in SEED_FILES}


def _starter_files(task: str) -> dict[str, str]:
    spec = importlib.util.find_spec(get_task(task).evaluator)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the {task} task's evaluator {get_task(task).evaluator} is not installed")
    root = Path(spec.origin).parent
    names = (get_task(task).asset, "program.md")
    missing = [name for name in names if not (root / name).is_file()]
    if missing:
        raise FileNotFoundError(f"the {task} task has no starter {', '.join(missing)} in {root}")
    return {name: (root / name).read_text(encoding="utf-8") for name in names}


def check_agent_for_task(agent: str, task: str) -> None:
    """Refuse, before anything is created, an agent that could propose nothing for the task."""
    from bot.agent.explorer import tunes

    get_task(task)  # an unknown task names the choices
    if agent == "explorer" and not tunes(task):
        raise ValueError(
            f"the offline explorer tunes the constants of train.py and router.py and the indexes of query.sql, "
            f"and has nothing to tune in the {task} task's {get_task(task).asset}: use --agent scripted "
            "--agent-script FILE, or --agent claude"
        )


class WrongTask(ValueError):
    """A work directory's repository holds another task than the one asked for."""


def check_task(workdir: Path, task: str) -> None:
    """A work directory's repository holds one task: refuse another before preparing anything for it.
    The task is the one program.md on its main names (training when it names none)."""
    try:
        program_md = git.Repo(workdir / "repo").git.show("main:program.md")
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, git.GitCommandError):
        return  # no repository yet, or no program.md on its main: the loop starts it or says what is wrong
    try:
        held = parse_program(program_md).settings.task
    except SettingsError:
        return  # the loop reports what is wrong with main's program.md, and keeps its task
    if held != task:
        raise WrongTask(
            f"the research repository in {workdir} holds the {held} task (its program.md says so), not {task}: "
            f"use --task {held} here, or another --workdir for {task}"
        )


class WorkdirBusy(RuntimeError):
    """Another conductor is running in this work directory."""


def lock_workdir(workdir: Path) -> TextIO:
    """Hold an exclusive lock on the work directory for this process's lifetime."""
    handle = open(workdir / "conductor.lock", "a+")  # not "w": that would wipe the holder's pid
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise WorkdirBusy(
            f"another autoresearch conductor is running in {workdir}; wait for it to "
            "finish (or stop it) before starting another"
        ) from None
    handle.truncate(0)
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def check_workdir(workdir: Path) -> Path:
    """The work directory as an absolute path (run directories are stored that way), refused
    clearly when it cannot be one. Creates nothing."""
    workdir = workdir.expanduser().resolve()
    if workdir.exists() and not workdir.is_dir():
        raise NotADirectoryError(f"{workdir} is a file, not a work directory: choose another --workdir")
    return workdir


def build_conductor(options: DemoOptions, console: Console | None = None) -> tuple[Conductor, Store, LocalRunner]:
    workdir = options.workdir
    if options.task == DEFAULT_TASK:
        prepare(options.profile, options.data, progress=console is not None)
    else:
        prepare_task(options.task, options.profile, data=options.data, progress=console is not None)
    forge = init_research_repo(workdir / "repo", seed_files(options.task))
    store = Store(workdir / "state.db")
    runner = LocalRunner(workdir / "runs", slots=options.slots, data=options.data, warm=True)
    if console is not None:
        from runner import sandbox

        usable, why = sandbox.available()
        console.print(
            f"sandbox: {why}"
            if usable
            else f"[bold yellow]WARNING: runs are NOT sandboxed[/] ({why}); "
            f"{get_task(options.task).asset} can read what you can read"
        )
    identity = (
        measurement_identity(options.profile, options.data, threads=runner.threads)
        if options.task == DEFAULT_TASK
        else task_identity(options.task, options.profile, data=options.data)
    )
    agent, budget = make_agent(options.agent, script=options.agent_script, seed=options.seed)
    config = ConductorConfig(
        profile=options.profile,
        identity=identity,
        max_experiments=options.experiments,
        agent_budget_usd=options.budget_usd if options.budget_usd is not None else budget,
    )
    conductor = Conductor(
        store, forge, runner, agent, config, publishers=[results.ResultsFile(store, workdir / "results.tsv")]
    )
    return conductor, store, runner


def check_profile(workdir: Path, profile: str) -> None:
    """A work directory measures one profile: refuse another before preparing anything for it."""
    db = workdir / "state.db"
    if not db.is_file():
        return
    store = Store(db)
    try:
        pinned = store.state.identity.get("profile")
    finally:
        store.close()
    measurement.refuse_other_profile(pinned, profile)


def run_demo(options: DemoOptions, console: Console | None = None) -> Summary:
    console = console or Console()
    get_profile(options.profile)  # an unknown profile is refused before anything is created
    check_agent_for_task(options.agent, options.task)
    options.workdir = check_workdir(options.workdir)
    check_profile(options.workdir, options.profile)
    check_task(options.workdir, options.task)
    options.workdir.mkdir(parents=True, exist_ok=True)
    lock = lock_workdir(options.workdir)
    _log_to(options.workdir / "conductor.log")
    try:
        return _run_locked(options, console)
    finally:
        lock.close()


def _run_locked(options: DemoOptions, console: Console) -> Summary:
    conductor, store, runner = build_conductor(options, console)
    budget = get_profile(options.profile).time_budget_s
    console.print(
        f"[bold]autoresearch demo[/]: {'' if options.task == DEFAULT_TASK else f'task [cyan]{options.task}[/], '}"
        f"profile [cyan]{options.profile}[/] ({budget:.0f}s per run), "
        f"{options.experiments} experiments, {options.slots} slot(s), work directory {options.workdir}"
    )
    started = time.time()
    printer = EventPrinter(store, console)
    dashboard = _start_dashboard(options, conductor, console)
    try:
        conductor.start()
        report = conductor_live(lambda: conductor)
        if options.live:
            with Live(console=console, refresh_per_second=4, transient=True) as live:

                def show(c: Conductor) -> None:
                    printer.print_new()
                    now = report()
                    live.update(render_live_progress(view_of(store, now), now, options.experiments, started))

                summary = Driver(conductor, timer_s=2.0, on_pass=show, on_wait=show).run()
        else:
            summary = Driver(conductor, timer_s=2.0, on_pass=lambda c: printer.print_new()).run()
        printer.print_new()
    finally:
        if dashboard is not None:
            dashboard.stop()
        runner.close()
        store.close()
    metric = get_task(options.task).metric
    console.print(render_summary(summary, time.time() - started, options.workdir / "results.tsv", metric))
    return summary


def _start_dashboard(options: DemoOptions, conductor: Conductor, console: Console):
    """The read-only dashboard of this work directory on a local port, for as long as the demo runs."""
    if options.dashboard_port is None:
        return None
    from bot.views.dashboard import dashboard_app, serve_in_thread

    app = dashboard_app(
        store_path=options.workdir / "state.db",
        live=conductor_live(lambda: conductor, conductor.config.agent_budget_usd),
    )
    try:
        server = serve_in_thread(app, port=options.dashboard_port)
    except RuntimeError:
        server = serve_in_thread(app, port=0)  # the port is taken: any free one
    console.print(f"dashboard: {server.url}")
    return server


class EventPrinter:
    """Prints each new event of the store once, as one line."""

    def __init__(self, store: Store, console: Console) -> None:
        self.store = store
        self.console = console
        self.last = store.events.last_id()

    def print_new(self) -> None:
        for event in self.store.events.all(after=self.last):
            self.last = event["id"]
            where = f"#{event['experiment_id']} " if event["experiment_id"] is not None else ""
            stamp = time.strftime("%H:%M:%S", time.localtime(event["at"]))
            self.console.print(
                f"{stamp} {where}{event['kind']}: {event['message']}", markup=False, highlight=False, soft_wrap=True
            )


def render_summary(summary: Summary, wall_s: float, results_tsv: Path, metric: Metric = TRAINING.metric) -> Table:
    """The demo's last word: the conductor's summary (its numbers on the loss scale), in `metric`."""
    table = Table(title="autoresearch: summary", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("experiments", str(summary.experiments))
    table.add_row(
        "kept / discarded / crashed / rejected / failed",
        f"{summary.kept} / {summary.discarded} / {summary.crashed} / {summary.rejected} / {summary.failed}",
    )
    n = places(metric)
    table.add_row(f"baseline {metric.name}", _fmt(shown_value(metric, summary.baseline_val_bpb), n))
    table.add_row(f"main's {metric.name} now (its own runs)", _fmt(shown_value(metric, summary.best_val_bpb), n))
    table.add_row("stopped because", summary.stop_reason or "-")
    table.add_row("wall time", f"{wall_s:.0f}s")
    table.add_row("results.tsv", str(results_tsv))
    return table


def _fmt(value: float | None, places: int) -> str:
    return "-" if value is None else f"{value:.{places}f}"


def _log_to(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    if not any(isinstance(h, logging.FileHandler) and h.baseFilename == str(path.resolve()) for h in root.handlers):
        root.addHandler(handler)
