"""The `autoresearch` command: prepare, run (alias train), demo, serve; steer, pause, resume, status, results,
plot, dashboard. prepare, run and demo take `--task` (runner.tasks; training by default)."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Autonomous ML research as pull requests; locally on the CPU by default.",
)
# Without a terminal (CI, nohup, a pipe) rich would cut tables at 80 columns (`purpo…`): output that
# is read later, or by a program, is written whole instead.
UNBOUNDED_WIDTH = 100_000
console = Console() if sys.stdout.isatty() else Console(width=UNBOUNDED_WIDTH)
DEFAULT_WORKDIR = Path(".autoresearch/demo")


TASK_HELP = "training, query-latency or ticket-routing: what is edited and how it is measured"


@app.command()
def prepare(
    profile: str = typer.Option("cpu", help="h100, cpu or smoke"),
    data: str = typer.Option(
        None,
        help="training: builtin, a base URL of parquet shards, or a directory of .txt/.md files; ticket-routing: "
        "a CSV (text, category) or JSONL file of tickets, or an https URL#sha256=HEX of one (default: the profile's)",
    ),
    task: str = typer.Option("training", help=TASK_HELP),
) -> None:
    """Prepare the data and tokenizer for a profile, or a task's fixed inputs (a second call does no work)."""
    from runner.data import DataMissing
    from runner.download import DownloadError
    from runner.prepare import prepare as do_prepare
    from runner.profiles import get_profile
    from runner.tasks import DEFAULT_TASK
    from runner.tasks.run import prepare_task

    try:
        get_profile(profile)
        if task != DEFAULT_TASK:
            fingerprint = prepare_task(task, profile, data=data, progress=True)
            console.print(f"{task}: the {profile} profile's inputs are ready (fingerprint {fingerprint})")
            return
        prepared = do_prepare(profile, data, progress=True)
    except (ValueError, DataMissing, DownloadError, OSError, RuntimeError) as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(2) from None
    ds = prepared.dataset
    console.print(
        f"data: {ds.train_docs} training and {ds.val_docs} validation documents in {ds.root} "
        f"(fingerprint {ds.fingerprint})"
    )
    console.print(
        f"tokenizer: {prepared.tokenizer.vocab_size} tokens, "
        f"{'trained now' if prepared.trained_tokenizer else 'already cached'}"
    )


def run(
    profile: str = typer.Option("cpu", help="h100, cpu or smoke"),
    asset: Path = typer.Option(None, help="the asset to run (default: the task's, train.py for training)"),
    task: str = typer.Option("training", help=TASK_HELP),
    data: str = typer.Option(None, help="data source (default: the profile's)"),
    out: Path = typer.Option(None, help="run directory (default: runs/<profile>-<time>)"),
    seed: int = typer.Option(0),
    budget_fraction: float = typer.Option(
        1.0, help="the share of the profile's time budget to train, in (0, 1]: a short (screening) run"
    ),
    gpu: str = typer.Option(None, help="the NVIDIA device index to use (a CUDA profile; default 0)"),
    as_json: bool = typer.Option(
        False, "--json", help="print the result as one JSON object on stdout (the training log goes to stderr)"
    ),
    no_sandbox: bool = typer.Option(False, "--no-sandbox", help="run without bubblewrap (marked unsandboxed)"),
) -> None:
    """Run the asset once, measured exactly as the bot's runners do: train.py trained in a sandbox and
    its model scored by a separate process, or another task's asset gated and measured by its
    evaluator. Exit code 0 when it was measured, 1 otherwise."""
    import time

    from runner.isolated import run_job
    from runner.profiles import get_profile
    from runner.protocol import JobSpec
    from runner.tasks import DEFAULT_TASK, get_task

    try:
        get_profile(profile)
        spec = get_task(task)
    except ValueError as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(2) from None
    asset = asset or Path(spec.asset)
    if not asset.is_file():
        console.print(f"[red]error:[/] {asset} does not exist")
        raise typer.Exit(2)
    out = (out or Path("runs") / f"{profile}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if not 0 < budget_fraction <= 1 or (budget_fraction != 1 and task != DEFAULT_TASK):
        console.print(
            f"[red]error:[/] --budget-fraction {budget_fraction:g}: give a share of the profile's time budget "
            "in (0, 1], 0.2 for a fifth; only training has a budget to shorten"
        )
        raise typer.Exit(2)
    job = JobSpec(
        task=task,
        run_id=0,
        asset=asset.read_text(encoding="utf-8"),
        profile=profile,
        seed=seed,
        budget_fraction=budget_fraction,
    )
    stream = sys.stderr if as_json else sys.stdout
    result = run_job(
        job,
        out,
        backend="manual",
        data=data,
        gpu=gpu,
        use_sandbox=False if no_sandbox else None,
        on_line=lambda line: print(line, file=stream, flush=True),
    )
    if as_json:
        print(result.model_dump_json(), flush=True)
        if result.status != "ok":
            raise typer.Exit(1)
        return
    print(result.summary_block(), flush=True)  # the reference's block: `grep "^val_bpb:" run.log` reads the score
    if result.status == "ok" and task != "training":
        console.print(
            f"{spec.metric.name} {spec.metric.format(result.value or 0.0)} {spec.metric.unit}, "
            f"{spec.metric.direction} is better  (measured outside the asset by the {task} evaluator in "
            f"{result.timings.evaluation:.1f}s; {'sandboxed' if result.sandboxed else '[yellow]NOT sandboxed[/]'})"
        )
        console.print(f"result: {out / 'result.json'}")
    elif result.status == "ok":
        timings = result.timings
        console.print(
            f"val_bpb {result.val_bpb:.6f}  (scored outside the sandbox: training {timings.training:.1f}s "
            f"on the {result.metrics.get('clock')} clock, evaluation {timings.evaluation:.1f}s; "
            f"{'sandboxed' if result.sandboxed else '[yellow]NOT sandboxed[/]'})"
        )
        console.print(f"result: {out / 'result.json'}")
    else:
        console.print(f"[red]{result.status}:[/] {result.error}  (log: {out / 'log.txt'})")
    if result.status != "ok":
        raise typer.Exit(1)


app.command("run")(run)
app.command("train", help="The same as `autoresearch run` (its name before tasks).")(run)


@app.command()
def demo(
    workdir: Path = typer.Option(DEFAULT_WORKDIR, help="where the research repo, store and runs live"),
    experiments: int = typer.Option(
        6,
        min=0,
        help="total experiments for this work directory (0: program.md's max_experiments, where 0 means no limit)",
    ),
    profile: str = typer.Option("cpu", help="cpu (about 40 s a run) or smoke (a few seconds)"),
    task: str = typer.Option("training", help=TASK_HELP),
    slots: int = typer.Option(1, min=1, help="runs in parallel"),
    seed: int = typer.Option(0, help="seed of the offline explorer"),
    data: str = typer.Option(None, help="data source (default: the profile's)"),
    agent: str = typer.Option("explorer", help="explorer (offline), claude (ANTHROPIC_API_KEY) or scripted"),
    agent_script: Path = typer.Option(None, help="the scripted agent's proposals (JSON lines)"),
    budget: float = typer.Option(
        None,
        min=0.0,
        help="stop proposing once the agent's answers cost this many "
        "dollars (default: AUTORESEARCH_ANTHROPIC_BUDGET_USD)",
    ),
    dashboard_port: int = typer.Option(
        8090, min=0, max=65535, help="the live dashboard's port on 127.0.0.1 (0: any free one)"
    ),
    no_dashboard: bool = typer.Option(False, "--no-dashboard", help="do not serve the dashboard"),
) -> None:
    """Run the research loop locally: a git repo on disk, the CPU, the offline explorer by default."""
    import git

    from bot.agent.choice import make_agent
    from bot.app.demo import DemoOptions, WorkdirBusy, check_agent_for_task, check_workdir, run_demo
    from bot.core.protocols import AgentError, ForgeError
    from bot.loop.conductor import ConductorError
    from bot.loop.program import SettingsError
    from bot.store.schema import SchemaTooNew
    from runner.data import DataMissing
    from runner.download import DownloadError
    from runner.profiles import get_profile

    try:  # mistakes in the arguments are reported before anything is created
        get_profile(profile)
        check_agent_for_task(agent, task)
        check_workdir(workdir)
        make_agent(agent, script=agent_script, seed=seed)  # a missing key or file, say
    except (ValueError, OSError, AgentError) as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(2) from None
    try:
        run_demo(
            DemoOptions(
                workdir=workdir,
                profile=profile,
                experiments=experiments,
                slots=slots,
                seed=seed,
                data=data,
                live=sys.stdout.isatty(),
                agent=agent,
                agent_script=agent_script,
                budget_usd=budget,
                dashboard_port=None if no_dashboard else dashboard_port,
                task=task,
            ),
            console,
        )
    except (WorkdirBusy, SchemaTooNew) as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print(f"stopped. Nothing was lost: run the same command again to resume ({workdir}).")
        raise typer.Exit(130) from None
    except (
        ConductorError,
        SettingsError,
        DataMissing,
        DownloadError,
        ForgeError,
        AgentError,
        git.GitCommandError,
        ValueError,
        OSError,
        RuntimeError,
        sqlite3.Error,
    ) as error:
        console.print(f"[red]error:[/] {error}")
        console.print(f"Nothing was lost: fix the cause and run the same command again to resume ({workdir}).")
        raise typer.Exit(1) from None


def _open_store(workdir: Path):
    from bot.store import Store

    db = workdir / "state.db"
    if not db.is_file():
        console.print(f"[red]error:[/] no state.db in {workdir}: run `autoresearch demo --workdir {workdir}` first")
        raise typer.Exit(2)
    return Store(db)


def _send(workdir: Path, kind: str, payload: dict | None = None) -> None:
    """Write one input to the work directory's inbox; a running conductor applies it within a second."""
    import getpass

    from bot.loop import inbox as events

    store = _open_store(workdir)
    try:
        events.submit(store, kind, payload, author=f"{getpass.getuser()} (cli)")
    finally:
        store.close()
    console.print(
        f"{kind}: sent to {workdir}; a running loop applies it within a second, a stopped one when it next starts"
    )


@app.command()
def serve(
    host: str = typer.Option(None, help="address to listen on (default: AUTORESEARCH_HOST or 127.0.0.1)"),
    port: int = typer.Option(None, help="port (default: AUTORESEARCH_PORT or 8080)"),
    poll: bool = typer.Option(
        None, "--poll/--webhooks", help="read events from the API instead of receiving webhooks (no public URL)"
    ),
    env_file: Path = typer.Option(None, help="a .env file of AUTORESEARCH_* settings (default: ./.env)"),
) -> None:
    """Run the bot on a GitHub repository: webhook server and conductor in one process."""
    import logging

    from bot.app.serve import serve as run_service
    from bot.app.settings import ConfigError, load_service_settings

    try:
        settings = load_service_settings(env_file, host=host, port=port, poll=poll)
    except ConfigError as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(2) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    console.print(
        f"autoresearch serve: {settings.repository} on http://{settings.host}:{settings.port} "
        f"({'polling the API' if settings.poll else 'webhooks at /webhook'}), state in {settings.state_dir}"
    )
    run_service(settings)


@app.command()
def steer(
    text: str = typer.Argument(..., help='what the agent should read, e.g. "try a lower MATRIX_LR"'),
    workdir: Path = typer.Option(DEFAULT_WORKDIR, help="the work directory of the loop"),
) -> None:
    """Tell the agent something: it reads it before its next proposal."""
    if not text.strip():
        console.print('[red]error:[/] say something, e.g. autoresearch steer "try a deeper model"')
        raise typer.Exit(2)
    _send(workdir, "steer", {"text": text})


@app.command()
def pause(workdir: Path = typer.Option(DEFAULT_WORKDIR, help="the work directory of the loop")) -> None:
    """Let running experiments finish and propose nothing new."""
    _send(workdir, "pause")


@app.command()
def resume(workdir: Path = typer.Option(DEFAULT_WORKDIR, help="the work directory of the loop")) -> None:
    """Undo `autoresearch pause` (a `paused: true` in program.md stays in force)."""
    _send(workdir, "resume")


@app.command()
def status(workdir: Path = typer.Option(DEFAULT_WORKDIR, help="the work directory of the loop")) -> None:
    """What is running and queued, main's val_bpb, and the latest events."""
    from bot.views.read_model import view_of
    from bot.views.status import EVENTS, render_workdir_status

    store = _open_store(workdir)
    try:
        console.print(render_workdir_status(view_of(store, events=EVENTS), store.writes.summary(time.time())))
    finally:
        store.close()


@app.command()
def results(
    workdir: Path = typer.Option(DEFAULT_WORKDIR, help="the work directory of a demo run"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    as_tsv: bool = typer.Option(False, "--tsv", help="print results.tsv"),
    runs: bool = typer.Option(False, "--runs", help="one row per run"),
) -> None:
    """Print the experiments of a work directory."""
    from bot.views import results as results_module
    from bot.views.read_model import view_of
    from bot.views.terminal import results_table, runs_table

    if sum((as_json, as_tsv)) > 1:
        console.print("[red]error:[/] choose one of --json and --tsv")
        raise typer.Exit(2)
    if as_tsv and runs:
        console.print("[red]error:[/] results.tsv has one row per experiment; for the runs use --runs or --runs --json")
        raise typer.Exit(2)
    store = _open_store(workdir)
    try:
        if as_json:
            rows = results_module.run_rows(store) if runs else results_module.rows(view_of(store))
            print(json.dumps(rows, indent=2))
        elif as_tsv:
            print(results_module.to_tsv(view_of(store)), end="")
        else:
            console.print(runs_table(store) if runs else results_table(view_of(store)))
    finally:
        store.close()


@app.command()
def dashboard(
    workdir: Path = typer.Option(DEFAULT_WORKDIR, help="the work directory (a demo's, or serve's state dir)"),
    host: str = typer.Option("127.0.0.1", help="the address to listen on"),
    port: int = typer.Option(8090, min=0, max=65535, help="the port (0: any free one)"),
    token: str = typer.Option(
        None, envvar="AUTORESEARCH_DASHBOARD_TOKEN", help="require ?token=... (or Authorization: Bearer)"
    ),
) -> None:
    """A read-only web page of a work directory, running or not: the chart, the experiments, the runs."""
    import uvicorn

    from bot.views.dashboard import dashboard_app, exposure_warning

    _open_store(workdir).close()  # a clear error for a work directory without a store
    if (warning := exposure_warning(host=host, port=port, token=token, takes_webhooks=False)) is not None:
        console.print(f"[yellow]warning:[/] {warning} (or pass --token)")
    console.print(f"dashboard of {workdir} on http://{host}:{port}/" + ("?token=..." if token else ""))
    uvicorn.run(
        dashboard_app(store_path=workdir.expanduser().resolve() / "state.db", token=token),
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=3,
    )


@app.command()
def plot(
    workdir: Path = typer.Option(DEFAULT_WORKDIR, help="the work directory (a demo's, or serve's state dir)"),
    out: Path = typer.Option(None, help="the chart to write, .png or .svg (default: WORKDIR/progress.png)"),
) -> None:
    """Write the progress chart: the task's metric over experiments, kept ones marked, main's best as a step line."""
    from bot.views.plot import write_chart
    from bot.views.text import places

    target = out or workdir / "progress.png"
    store = _open_store(workdir)
    try:
        data = write_chart(store, target)
    except (ValueError, OSError) as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(2) from None
    finally:
        store.close()
    best = f", best {data.metric.name} {data.best:.{places(data.metric)}f}" if data.best is not None else ""
    rejected = f", {data.rejected} rejected" if data.rejected else ""
    console.print(
        f"wrote {target}: {len(data.points)} points, {data.kept} kept, {data.crashed} crashed{rejected}{best}"
    )


if __name__ == "__main__":
    app()
