"""The `autoresearch` command: prepare, train, demo, results."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Autonomous ML research as pull requests; locally on the CPU by default.")
console = Console()
DEFAULT_WORKDIR = Path(".autoresearch/demo")


@app.command()
def prepare(profile: str = typer.Option("cpu", help="h100, cpu or smoke"),
            data: str = typer.Option(None, help="builtin, a base URL of parquet shards, or a directory of "
                                                 ".txt/.md files (default: the profile's)")) -> None:
    """Prepare the data and tokenizer for a profile (a second call does no work)."""
    from runner.data import DataMissing
    from runner.download import DownloadError
    from runner.prepare import prepare as do_prepare
    from runner.profiles import get_profile

    try:
        get_profile(profile)
        prepared = do_prepare(profile, data, progress=True)
    except (ValueError, DataMissing, DownloadError, OSError, RuntimeError) as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(2) from None
    ds = prepared.dataset
    console.print(f"data: {ds.train_docs} training and {ds.val_docs} validation documents in {ds.root} "
                  f"(fingerprint {ds.fingerprint})")
    console.print(f"tokenizer: {prepared.tokenizer.vocab_size} tokens, "
                  f"{'trained now' if prepared.trained_tokenizer else 'already cached'}")


@app.command()
def train(profile: str = typer.Option("cpu", help="h100, cpu or smoke"),
          asset: Path = typer.Option(Path("train.py"), help="the train.py to run"),
          data: str = typer.Option(None, help="data source (default: the profile's)"),
          out: Path = typer.Option(None, help="run directory (default: runs/<profile>-<time>)"),
          seed: int = typer.Option(0)) -> None:
    """Run one time-boxed training run and print its summary block."""
    import time

    from runner import launch
    from runner.profiles import get_profile

    try:
        get_profile(profile)
    except ValueError as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(2) from None
    if not asset.exists():
        console.print(f"[red]error:[/] {asset} does not exist")
        raise typer.Exit(2)
    out = out or Path("runs") / f"{profile}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = launch.run(asset.resolve(), profile, out, seed=seed, data=data,
                        on_line=lambda line: print(line, flush=True))
    if result.get("status") != "ok":
        console.print(f"[red]run failed:[/] {result.get('error')}  (log: {out / 'log.txt'})")
        raise typer.Exit(1)
    console.print(f"result: {out / 'result.json'}")


@app.command()
def demo(workdir: Path = typer.Option(DEFAULT_WORKDIR, help="where the research repo, store and runs live"),
         experiments: int = typer.Option(6, min=0, help="total experiments for this work directory"),
         profile: str = typer.Option("cpu", help="cpu (about 40 s a run) or smoke (a few seconds)"),
         slots: int = typer.Option(1, min=1, help="runs in parallel"),
         seed: int = typer.Option(0, help="seed of the offline explorer"),
         data: str = typer.Option(None, help="data source (default: the profile's)")) -> None:
    """Run the research loop locally: a git repo on disk, the CPU, the offline explorer."""
    import git

    from bot.agent import AgentError
    from bot.conductor import ConductorError
    from bot.demo import DemoOptions, WorkdirBusy, run_demo
    from bot.forge import ForgeError
    from bot.settings import SettingsError
    from runner.data import DataMissing
    from runner.download import DownloadError

    try:
        run_demo(DemoOptions(workdir=workdir, profile=profile, experiments=experiments, slots=slots,
                             seed=seed, data=data, live=sys.stdout.isatty()), console)
    except WorkdirBusy as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(1) from None
    except (ConductorError, SettingsError, DataMissing, DownloadError, ForgeError, AgentError, git.GitCommandError,
            ValueError, OSError, RuntimeError, sqlite3.Error) as error:
        console.print(f"[red]error:[/] {error}")
        console.print(f"Nothing was lost: fix the cause and run the same command again to resume ({workdir}).")
        raise typer.Exit(1) from None


@app.command()
def results(workdir: Path = typer.Option(DEFAULT_WORKDIR, help="the work directory of a demo run"),
            as_json: bool = typer.Option(False, "--json", help="print JSON"),
            as_tsv: bool = typer.Option(False, "--tsv", help="print results.tsv")) -> None:
    """Print the experiments of a work directory."""
    from bot import results as results_module
    from bot.demo import results_table
    from bot.store import Store

    db = workdir / "state.db"
    if not db.exists():
        console.print(f"[red]error:[/] no state.db in {workdir}: run `autoresearch demo --workdir {workdir}` first")
        raise typer.Exit(2)
    store = Store(db)
    try:
        if as_json:
            print(json.dumps(results_module.rows(store), indent=2))
        elif as_tsv:
            print(results_module.to_tsv(store), end="")
        else:
            console.print(results_table(store))
    finally:
        store.close()


if __name__ == "__main__":
    app()
