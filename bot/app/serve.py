"""`autoresearch serve`: the long-running service on a real GitHub repository.

One process holds the webhook server (bot.app.web, on uvicorn, in the main thread) and the conductor
(bot.loop.driver, on its own thread). A delivery is stored in the inbox and wakes the driver; the
conductor does the work. Pull requests, checks, comments and the research log are published on a
worker thread of their own (bot.loop.publishing, with its own connections to the store and to
GitHub): a tick hands it the snapshot and goes on, so no tick waits for GitHub or its write limits;
results.tsv is written in the tick. Without a public URL (`--poll`), a poller (bot.github.poller, on
a GitHub client of its own) reads the same events from the API on a timer and feeds the same inbox.
Every GitHub client shares the conductor's write budget (bot.github.budget).

Stopping (Ctrl-C, SIGTERM) ends every wait for GitHub at once (github_sleep waits on the stop event,
and the write budget gives up a write that must wait); the driver waits a bounded time for the
publishing worker, and the runner is closed (its local training processes end) even if the
conductor's thread is stuck. What was not shown yet is shown after the next start: the publisher
makes up the difference between the store and GitHub.

The server answers webhooks from its first second, even while GitHub is unreachable: the
conductor thread connects when it can (backing off), reconciles the store with GitHub by its
markers, and then works through what waited in the store.

GET /healthz tells the truth about the conductor (ConductorState): starting, waiting for GitHub
(and why), running, stalled (running, but silent past stall_bound_s: a tick stuck on a call that
never returns, or a deadlock), or stopped with the reason; stalled and stopped answer 503, so the
container's health check sees a service that accepts webhooks but will not act on them. The
conductor shows a sign of life at the end of each tick, at each inbox poll between ticks and at
each wait GitHub asked for (the client sleeps through Service.github_sleep, which notes when the
wait ends), so only silence that no legitimate wait explains counts. The reasons are redacted of
every secret the settings hold: the health answer is open to whoever reaches the server. The
dashboard at / is as open as the server unless AUTORESEARCH_DASHBOARD_TOKEN is set, and a server
that takes webhooks is reachable from the internet by design: bot.views.dashboard.exposure_warning says
when to warn.

The task (runner.tasks: training, query-latency, ticket-routing) is the one program.md on main names
(`autoresearch: {task: ...}`; training when it names none). The parts are made for it (its inputs
prepared and its identity, runner.tasks.run.task_identity, on the local runner), and the identity the
store pins carries it. A repository holds one task: a store that measured another is refused at
start (`WrongTask`), with what to do; a program.md that names another task while the service runs is
the loop's settings error (bot.loop.program).

    <state_dir>/state.db     the store (the inbox, experiments, runs, what GitHub shows)
    <state_dir>/runs/<id>/   one directory per training run (the local runner)
    <state_dir>/results.tsv  the reference's results table
"""

from __future__ import annotations

import copy
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.agent.choice import make_agent
from bot.app.settings import ServiceSettings
from bot.core.protocols import Agent, Runner
from bot.core.router import Router
from bot.github import handlers
from bot.github.branches import BudgetBranches
from bot.github.client import BACKOFF_MAX_S, MAX_RATE_LIMIT_WAIT_S, RETRIES, GitHubClient
from bot.github.forge import GitHubForge
from bot.github.permissions import CollaboratorPermissions
from bot.github.publisher import GitHubPublisher, pull_request_first
from bot.loop import inbox
from bot.loop.baseline import PROGRAM
from bot.loop.conductor import Conductor, ConductorConfig
from bot.loop.driver import Driver
from bot.loop.forge_calls import ForgeWorker
from bot.loop.program import SettingsError, parse_program
from bot.loop.publishing import PublishWorker
from bot.store import Store
from bot.views.results import ResultsFile
from runner.tasks import DEFAULT_TASK

if TYPE_CHECKING:
    from bot.github.poller import Poller

log = logging.getLogger(__name__)
DETAIL_CHARS = 500  # a reason shown by /healthz is cut here; the log has all of it
STALL_FLOOR_S = 10 * 60  # the shortest silence ever called a stall


def stall_bound_s(request_timeout_s: float) -> float:
    """How long the running conductor may show no sign of life before /healthz calls it stalled:
    the longest one GitHub request may legitimately take (a rate-limit wait of MAX_RATE_LIMIT_WAIT_S,
    every attempt at its timeout, every backoff), never under STALL_FLOOR_S. With the default 15 s
    timeout: 900 + 6 x 15 + 5 x 30 = 1140 s, 19 minutes. The waits the service sees (github_sleep)
    do not count against it at all; the bound still covers one it did not see."""
    one_request = MAX_RATE_LIMIT_WAIT_S + (RETRIES + 1) * request_timeout_s + RETRIES * BACKOFF_MAX_S
    return max(STALL_FLOOR_S, one_request)


class ConductorState(StrEnum):
    """What the conductor thread is doing, as /healthz reports it. Transitions:
    STARTING -> WAITING_FOR_GITHUB (until GitHub answers) -> STARTING (building the rest) -> RUNNING;
    any state -> STOPPED (an error, or the service shutting down). STOPPED is final. STALLED is
    never set: it is RUNNING seen from outside after a silence past stall_bound_s, and becomes
    RUNNING again if the conductor wakes up."""

    STARTING = "starting"  # reaching GitHub, preparing the runner and the agent
    WAITING_FOR_GITHUB = "waiting_for_github"  # GitHub did not answer (or refused): tried again later
    RUNNING = "running"
    STALLED = "stalled"  # running, but silent too long: a tick is stuck (503)
    STOPPED = "stopped"  # the web side still stores deliveries; nothing acts on them


@dataclass
class Parts:
    """What the conductor runs with, besides GitHub: a runner, an agent, the pinned identity."""

    runner: Runner
    agent: Agent
    identity: dict[str, str]
    budget_usd: float | None = None  # what the agent's answers may cost in all (None: no limit)


class WrongTask(RuntimeError):
    """The service's store measured another task than the one main's program.md names."""


def main_task(forge: GitHubForge, store: Store) -> str:
    """The task program.md on main names (training when there is none or it names none). While its
    front matter is invalid, the task the store measures (the loop reports the error itself)."""
    try:
        text = forge.read_file(forge.main_sha(), PROGRAM)
    except FileNotFoundError:
        return DEFAULT_TASK
    try:
        return parse_program(text).settings.task
    except SettingsError:
        return store.state.identity.get("task", DEFAULT_TASK)


def refuse_other_task(store: Store, task: str, state_dir: Path) -> None:
    """Raise WrongTask when the store pinned the measurement of another task (an identity pinned
    before tasks, or without one, is training's): their numbers never compare."""
    pinned = store.state.identity
    held = pinned.get("task", DEFAULT_TASK) if pinned else task
    if held != task:
        raise WrongTask(
            f"program.md on main names the {task} task, but this service's store ({state_dir / 'state.db'}) "
            f"measures the {held} task: a repository holds one task. Put `task: {held}` back in program.md's "
            f"front matter, or give the service a new AUTORESEARCH_STATE_DIR (and a repository) for {task}"
        )


def default_parts(settings: ServiceSettings, client: GitHubClient, task: str = DEFAULT_TASK) -> Parts:
    """The configured runner (local, Actions or Modal), checked ready to measure `task` under the
    identity, and the agent."""
    from runner.profiles import check_task_profile, harness_hash

    check_task_profile(task, settings.profile)  # query-latency on h100, say: refused before a runner is made
    if settings.runner == "local":
        return local_parts(settings, client, task)
    from bot.runners.capacity import slots_file
    from bot.runners.modal import modal_runner

    if settings.runner == "actions":
        from bot.runners.actions import ActionsRunner, ActionsSettings

        runner: Runner = ActionsRunner(
            client.repo,
            settings.state_dir,
            ActionsSettings(),
            pace_write=client.pace_write,
            slots_file=slots_file(settings.state_dir),
        )
    else:
        runner = modal_runner(settings.state_dir, slots_file=slots_file(settings.state_dir))
    # The bot measures nothing itself: the harness is its own code, the data the runners' (a setting).
    identity = {
        "profile": settings.profile,
        "harness_hash": harness_hash(task),
        "data_fingerprint": str(settings.data_fingerprint),
    }
    if task != DEFAULT_TASK:
        identity["task"] = task
    runner.check_ready(identity)
    agent, budget = make_agent(settings.agent, script=settings.agent_script)
    return Parts(runner=runner, agent=agent, identity=identity, budget_usd=budget)


def local_parts(settings: ServiceSettings, client: GitHubClient | None = None, task: str = DEFAULT_TASK) -> Parts:
    """The local runner on this machine (the task's inputs prepared here) and the configured agent."""
    from bot.runners.capacity import slots_file
    from bot.runners.local import LocalRunner  # the harness (and torch) only where runs happen here
    from runner.identity import measurement_identity
    from runner.prepare import prepare
    from runner.tasks.run import prepare_task, task_identity

    if task == DEFAULT_TASK:
        prepare(settings.profile, None, progress=False)
    else:
        prepare_task(task, settings.profile)
    runner = LocalRunner(
        settings.state_dir / "runs",
        slots=settings.slots,
        warm=settings.warm_workers,
        slots_file=slots_file(settings.state_dir),
    )
    identity = (
        measurement_identity(settings.profile, None, threads=runner.threads)
        if task == DEFAULT_TASK
        else task_identity(task, settings.profile)
    )
    runner.check_ready(identity)
    agent, budget = make_agent(settings.agent, script=settings.agent_script)
    return Parts(runner=runner, agent=agent, identity=identity, budget_usd=budget)


@dataclass
class Service:
    settings: ServiceSettings
    make_parts: Callable[[ServiceSettings, GitHubClient, str], Parts] = default_parts
    timer_s: float = 30.0
    connect_backoff_s: tuple[float, float] = (2.0, 120.0)
    clock: Callable[[], float] = time.monotonic  # the stall check's clock (a test moves it)
    sleep: Callable[[float], object] | None = None  # how github_sleep waits (None: until stop(), at most)
    driver: Driver | None = None
    conductor: Conductor | None = None
    client: GitHubClient | None = None
    # (state, what it waits for or why it stopped), replaced whole so another thread never reads half
    _phase: tuple[ConductorState, str] = (ConductorState.STARTING, "not started")
    last_tick: float | None = None  # wall time the last tick ended
    # clock() of the conductor's last sign of life, or the promised end of the wait it is in; None
    # until it runs. One float, replaced whole.
    _alive_at: float | None = None
    _stack_logged_for: float | None = None  # the _alive_at whose stall already put a stack in the log
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def store_path(self) -> Path:
        return self.settings.state_dir / "state.db"

    # --- the web side --------------------------------------------------------------------------------
    def wake(self) -> None:
        if self.driver is not None:
            self.driver.wake()

    def runs_changed(self) -> None:
        """A workflow_run/workflow_job delivery: the runner is told (the Actions runner asks GitHub at
        once, and wakes the driver)."""
        if self.conductor is not None:
            self.conductor.runner.notify()

    @property
    def state(self) -> ConductorState:
        return self._phase[0]

    @property
    def detail(self) -> str:
        return self._phase[1]

    @property
    def status(self) -> str:
        """The conductor's state and detail in one line (for logs and test failures)."""
        state, detail = self._current()
        return f"{state.value}: {detail}" if detail else state.value

    @property
    def stall_after_s(self) -> float:
        return stall_bound_s(self.settings.request_timeout_s)

    def health(self) -> dict[str, Any]:
        """What /healthz shows to anyone: the conductor's state and why, its last tick, how long it
        has been silent (`conductor_quiet_s`, while it runs), how long the publish in progress has
        run (`publishing_s`, None while the publishing worker is idle), the last contact with GitHub;
        `ok` is False once the conductor stalled or stopped (503). Nothing secret."""
        state, detail = self._current()
        publishing = self.conductor.publishing if self.conductor is not None else None
        report: dict[str, Any] = {
            "ok": state not in (ConductorState.STOPPED, ConductorState.STALLED),
            "conductor": state.value,
            "conductor_detail": self._shown(detail),
            "last_tick": self.last_tick,
            "conductor_quiet_s": self._quiet_s(),
            "publishing_s": None if publishing is None or publishing.busy_s is None else round(publishing.busy_s, 1),
        }
        if self.client is not None:
            report.update(
                {
                    key: self._shown(value) if isinstance(value, str) else value
                    for key, value in self.client.health().items()
                }
            )
        return report

    def _current(self) -> tuple[ConductorState, str]:
        """The state as set, unless the thread is gone without saying so (it set STOPPED otherwise)."""
        state, detail = self._phase
        thread = self._thread
        if state is not ConductorState.STOPPED and thread is not None and not thread.is_alive():
            return ConductorState.STOPPED, "the conductor thread ended without a reason; see the log"
        if state is ConductorState.RUNNING:
            quiet, bound = self._quiet_s(), self.stall_after_s
            if quiet is not None and quiet > bound:
                self._log_stack()
                return ConductorState.STALLED, (
                    f"no sign of life from the conductor for {quiet / 60:.0f} min (the bound is {bound / 60:.0f} "
                    "min): a tick is stuck on a call that never returns, or a deadlock; its thread's stack is in "
                    "the log. Restart the service: deliveries wait in the store"
                )
            if self.conductor is not None and self.conductor.blocked:
                detail = f"main needs a person: {self.conductor.blocked}"
        return state, detail

    def _quiet_s(self) -> float | None:
        """Seconds since the running conductor's last sign of life (never below 0: inside a wait
        GitHub asked for it counts from the wait's end), or None when it is not running."""
        alive_at = self._alive_at
        if alive_at is None or self._phase[0] is not ConductorState.RUNNING:
            return None
        return round(max(0.0, self.clock() - alive_at), 1)

    def _log_stack(self) -> None:
        """The stalled conductor thread's stack, once per stall: where it hangs, before a restart
        loses it."""
        alive_at, thread = self._alive_at, self._thread
        if alive_at == self._stack_logged_for or thread is None or thread.ident is None:
            return
        self._stack_logged_for = alive_at
        frame = sys._current_frames().get(thread.ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(gone)\n"
        log.error(
            "the conductor shows no sign of life past %.0f s; its thread's stack:\n%s",
            self.stall_after_s,
            stack.rstrip(),
        )

    # --- the conductor's signs of life (called on its thread) ---------------------------------------
    def _alive(self, conductor: Conductor | None = None) -> None:
        """A tick ended, or the driver polled the inbox between ticks."""
        self._alive_at = self.clock()

    def github_sleep(self, seconds: float) -> None:
        """Every wait the GitHub client makes (a rate limit, a backoff, write pacing): on the
        conductor thread it is a sign of life until the wait's promised end, however long GitHub
        asked for (the pacer can ask for most of an hour). On other threads it is only a sleep."""
        ours = threading.current_thread() is self._thread and self._phase[0] is ConductorState.RUNNING
        if ours:
            self._alive_at = self.clock() + max(0.0, seconds)
        try:
            (self.sleep or self._stop.wait)(seconds)
        finally:
            if ours:
                self._alive_at = self.clock()

    def _shown(self, text: str) -> str:
        text = self.settings.redact(text)
        return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"

    def _set(self, state: ConductorState, detail: str) -> None:
        self._phase = (state, detail)

    def app(self):  # -> FastAPI
        """The webhook server (/webhook, /healthz) with the read-only dashboard at /."""
        from bot.app.web import create_app
        from bot.views.dashboard import create_dashboard, exposure_warning, github_links
        from bot.views.read_model import conductor_live

        settings = self.settings
        secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret else ""
        app = create_app(
            store_path=self.store_path,
            secret=secret,
            wake=self.wake,
            health=self.health,
            runs_changed=self.runs_changed,
        )
        token = settings.dashboard_token.get_secret_value() if settings.dashboard_token else None
        warning = exposure_warning(
            host=settings.host, port=settings.port, token=token, takes_webhooks=not settings.poll
        )
        if warning:
            log.warning("%s", warning)
        elif token is None:
            log.info(
                "the dashboard at / is open to this machine only (polling, bound to %s); set "
                "AUTORESEARCH_DASHBOARD_TOKEN before putting a proxy in front of it",
                settings.host,
            )
        budget = self.conductor.config.agent_budget_usd if self.conductor else None
        app.include_router(
            create_dashboard(
                store_path=self.store_path,
                token=token,
                live=conductor_live(lambda: self.conductor, budget),
                links=github_links(settings.repository, settings.github_api_url),
            )
        )
        return app

    # --- the conductor side --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the conductor thread (returns at once)."""
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        Store(self.store_path).close()  # create and migrate before the web side opens it
        self._set(ConductorState.STARTING, "connecting to GitHub")
        log.info("connecting to GitHub at %s", self.settings.github_api_url)
        self._thread = threading.Thread(target=self._conduct, name="conductor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the conductor thread (waiting at most `timeout` for it), then close its runner, even
        under a tick still stuck in it: a runner left open would leave its training processes running."""
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("the conductor did not stop within %.0f s: closing its runner under it", timeout)
        if self.conductor is not None:
            self.conductor.lifecycle.calls.close(timeout=5.0)
            self.conductor.runner.close()

    def _conduct(self) -> None:
        try:
            conductor = self._connect()
            if conductor is None:
                self._set(ConductorState.STOPPED, "the service stopped before GitHub answered")
                return
            self.driver = Driver(conductor, timer_s=self.timer_s, on_pass=self._ticked, on_wait=self._alive)
            if self.settings.poll:
                self._start_poller()
            self._alive_at = self.clock()
            self._set(ConductorState.RUNNING, "")
            self.driver.run(forever=True, stop=self._stop)
            self._set(ConductorState.STOPPED, "the service is shutting down")
        except Exception as error:  # noqa: BLE001 - the web side stays up and says what happened
            self._set(
                ConductorState.STOPPED,
                f"stopped by an error: {type(error).__name__}: {error}; fix it (the "
                "log has the traceback) and restart the service: deliveries meanwhile wait in the store",
            )
            log.exception("the conductor stopped")

    def _start_poller(self) -> Poller:
        """Start the poller's thread, with a GitHub client of its own (a PyGithub connection holds the
        one request being made, so the conductor's requests and the poller's would swap on one), sharing
        the conductor's write budget."""
        from bot.github.poller import Poller

        assert self.client is not None, "the poller starts once the conductor is connected"
        client = GitHubClient(self.settings.github(), sleep=self.github_sleep, budget=self.client.budget)
        poller = Poller(client, Store(self.store_path), interval_s=self.settings.poll_interval_s, wake=self.wake)
        threading.Thread(target=poller.run, args=(self._stop,), name="poller", daemon=True).start()
        log.info("polling GitHub every %.0fs (no webhooks)", self.settings.poll_interval_s)
        return poller

    def _ticked(self, conductor: Conductor) -> None:
        self.last_tick = time.time()
        self._alive(conductor)

    def _connect(self) -> Conductor | None:
        """Reach GitHub (backing off while it is unreachable), then build the conductor."""
        settings = self.settings
        self.client = GitHubClient(settings.github(), sleep=self.github_sleep, stop=self._stop)
        wait = self.connect_backoff_s[0]
        while not self._stop.is_set():
            try:
                repo = self.client.repo()
                login = self.client.bot_login
                break
            except Exception as error:  # noqa: BLE001 - GitHub down, a bad token: say so, try again
                self._set(
                    ConductorState.WAITING_FOR_GITHUB, f"{type(error).__name__}: {error}; next try in {wait:.0f}s"
                )
                log.warning("waiting for GitHub at %s: %s", settings.github_api_url, settings.redact(self.detail))
                self._stop.wait(wait)
                wait = min(self.connect_backoff_s[1], wait * 2)
        else:
            return None
        self._set(ConductorState.STARTING, "connected to GitHub; preparing the runner and the agent")
        store = Store(self.store_path)
        store.state.bot_login = login
        # the inbox's handlers: the loop's own inputs, and GitHub's events, which act on this repository
        # only, steered by people GitHub says have write access
        github = handlers.GitHubEvents(
            settings.repository, CollaboratorPermissions.for_repository(repo), loop=inbox.router
        )
        router = Router(inbox.router, github.router())
        forge = GitHubForge(repo, main_branch=settings.main_branch, pace_write=self.client.pace_write)
        task = main_task(forge, store)
        refuse_other_task(store, task, settings.state_dir)
        parts = self.make_parts(settings, self.client, task)
        # Experiment branches, pushed once something reads them: at once for Actions (it checks out the
        # job's commit), else once a run starts, and in the degraded mode only for kept and promising ones
        branches = BudgetBranches(self.client.budget, runner_reads_branch=settings.runner == "actions")
        if self.client.budget.mode.mode == "degraded":  # what a former life left without a branch stays so
            branches.left_unbranched(store.experiments.started_without_branch())
        # The publishing worker (bot.loop.publishing) has connections of its own: to the store (a Store
        # serves one thread at a time) and to GitHub (a PyGithub connection holds the one request being
        # made, so two threads on it would swap each other's requests). The write budget is shared.
        publishing_store = Store(self.store_path)
        publishing_repo = GitHubClient(settings.github(), sleep=self.github_sleep, budget=self.client.budget).repo()
        publisher = GitHubPublisher(
            publishing_store,
            publishing_repo,
            read_file=GitHubForge(publishing_repo, main_branch=settings.main_branch).read_file,
            uses_app=self.client.uses_app,
            main_branch=settings.main_branch,
            budget=self.client.budget,
            on_pull_request=self.wake,  # a keep waiting for its pull request merges at once
        )
        config = ConductorConfig(
            profile=settings.profile,
            identity=parts.identity,
            agent_budget_usd=parts.budget_usd,
            max_open_questions=settings.max_open_questions,
        )
        self.conductor = Conductor(
            store,
            forge,
            parts.runner,
            parts.agent,
            config,
            publishers=[ResultsFile(store, settings.state_dir / "results.tsv")],
            publishing=PublishWorker([publisher], publishing_store),
            router=router,
            merge_gate=pull_request_first(store, self.client.budget),
            forge_worker=ForgeWorker(self._forge_of_its_own),  # branches and rebases off this thread
            branches=branches,
        )
        log.info("connected to %s as %s (%s)", repo.full_name, login, "App" if self.client.uses_app else "token")
        return self.conductor

    def _forge_of_its_own(self) -> GitHubForge:
        """A forge on a GitHub connection of its own (for the forge worker's thread: a PyGithub
        connection holds the one request being made), sharing the write budget."""
        settings = self.settings
        client = GitHubClient(settings.github(), sleep=self.github_sleep, budget=self.client.budget)
        return GitHubForge(client.repo(), main_branch=settings.main_branch, pace_write=client.pace_write)


def serve(
    settings: ServiceSettings,
    *,
    make_parts: Callable[[ServiceSettings, GitHubClient, str], Parts] = default_parts,
    timer_s: float = 30.0,
) -> None:
    """Run the service until interrupted (Ctrl-C or SIGTERM)."""
    import uvicorn

    service = Service(settings, make_parts=make_parts, timer_s=timer_s)
    service.start()
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config.setdefault("filters", {})["not_a_webhook"] = {"()": lambda: not_a_webhook}
    log_config["loggers"]["uvicorn.access"]["filters"] = ["not_a_webhook"]
    try:
        uvicorn.run(
            service.app(),
            host=settings.host,
            port=settings.port,
            log_level="info",
            log_config=log_config,
            timeout_graceful_shutdown=3,
        )  # open dashboard streams must not hold up Ctrl-C
    finally:
        service.stop()


def not_a_webhook(record: logging.LogRecord) -> bool:
    """uvicorn's access log without POST /webhook: bot.app.web logs each delivery itself, with its id and
    what became of it, so a second line per delivery is only CPU spent during a burst."""
    args = record.args
    return not (
        isinstance(args, tuple)
        and len(args) >= 3
        and args[1] == "POST"
        and str(args[2]).partition("?")[0] == "/webhook"
    )
