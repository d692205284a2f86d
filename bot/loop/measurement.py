"""What counts as a measurement: the identity a work directory measures under, and whether one
runner's result may count for the run it claims to answer.

The identity (profile, harness hash, data fingerprint, and on a CPU-clock profile the allotted
thread count, because that budget is CPU time per thread) is pinned in the store when a conductor
starts. A result counts only if it answers its run id, measured exactly the queued train.py, and
carries that identity; a CPU run that got far less of its cores than main's recent runs did says
more about a busy machine than about its train.py and is run once more. These are pure checks on
numbers: the conductor decides what to do with their answers.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from bot.core.records import RunResult, asset_sha256
from bot.store import Run, Store

IDENTITY_KEYS = ("profile", "harness_hash", "data_fingerprint")
OPTIONAL_KEYS = ("threads",)


class WrongProfile(RuntimeError):
    """The work directory measures another profile; the message says what to do."""


def pinned_threads(identity: dict[str, Any]) -> int | None:
    value = identity.get("threads")
    return None if value is None else int(value)


def refuse_other_profile(pinned: str | None, profile: str) -> None:
    """Raise WrongProfile when a work directory pinned to `pinned` is asked to measure `profile`."""
    if pinned and pinned != profile:
        raise WrongProfile(f"this work directory measures with profile {pinned!r}, not {profile!r}: their numbers "
                           f"do not compare. Use --profile {pinned} here, or another --workdir for {profile!r}.")


def pin(store: Store, identity: dict[str, Any]) -> list[str]:
    """Fix `identity` for the work directory of `store`; returns what changed, in words (also
    recorded as events). Another profile is refused: its numbers never compare. A changed harness,
    data set or thread count is accepted and starts a new baseline, because earlier runs no longer
    count."""
    current = {k: str(identity[k]) for k in IDENTITY_KEYS}
    current.update({k: str(identity[k]) for k in OPTIONAL_KEYS if k in identity})
    stored_text = store.get_setting("identity")
    if stored_text is None:
        store.set_setting("identity", json.dumps(current))
        store.event(None, "identity", "measuring under " + ", ".join(f"{k} {v}" for k, v in current.items()))
        return []
    stored = json.loads(stored_text)
    refuse_other_profile(stored.get("profile") or "?", current["profile"])
    changed = [f"{k} {stored.get(k)} -> {current[k]}" for k in (*IDENTITY_KEYS[1:], *OPTIONAL_KEYS)
               if k in current and stored.get(k) != current[k]]
    if not changed:
        return []
    message = (f"the measurement changed ({'; '.join(changed)}): earlier runs no longer count, main is measured "
               "afresh and open experiments are measured again")
    store.set_setting("identity", json.dumps(current))
    store.event(None, "identity", message)
    return [message]


def counts(run: Run, identity: dict[str, Any]) -> bool:
    """Whether a finished run was measured under `identity`."""
    threads = pinned_threads(identity)
    return (run.profile == identity["profile"] and run.harness_hash == identity["harness_hash"]
            and run.data_fingerprint == identity["data_fingerprint"]
            and (threads is None or run.metrics.get("clock") != "cpu" or run.metrics.get("threads") == threads))


def refusal(run: Run, result: RunResult, identity: dict[str, Any]) -> str | None:
    """Why `result` may not count for `run`, or None: it must answer this job, with this code,
    measured under the pinned identity."""
    if result.run_id != run.id:
        return f"it answers run {result.run_id}, not run {run.id}"
    if "seed" in result.metrics and result.metrics["seed"] != run.seed:
        return f"it ran with seed {result.metrics['seed']}, not run {run.id}'s seed {run.seed}"
    reported = result.metrics.get("asset_sha256")
    if reported and reported != asset_sha256(run.asset):
        return "it measured another train.py than the one queued (asset sha256 differs)"
    if result.status != "ok":
        return None  # a crash carries no identity to compare: it counts as this train.py's crash
    if not reported:
        return "it does not say which train.py it measured (no asset_sha256)"
    for key in IDENTITY_KEYS:
        if result.metrics.get(key) != identity[key]:
            return f"its {key} is {result.metrics.get(key)!r} but this work directory measures under {identity[key]!r}"
    threads = pinned_threads(identity)
    if threads is not None and result.metrics.get("clock") == "cpu" and result.metrics.get("threads") != threads:
        return (f"it ran on {result.metrics.get('threads')} CPU threads but this work directory measures with "
                f"{threads} (its budget is CPU time per thread)")
    return None


def disturbance(run: Run, result: RunResult, recent_main_runs: list[Run], share_floor: float) -> str | None:
    """Why this run's number says more about a busy machine than about its train.py, or None.

    A CPU run's budget is CPU time, but a neighbour still slows it (caches, memory bandwidth). One
    that got less than `share_floor` of the CPU share main's recent runs got is run again, once: a
    re-run counts whatever it gets, so a machine that stays busy cannot stall the loop."""
    share = result.metrics.get("cpu_share")
    if result.status != "ok" or run.rerun_of is not None or result.metrics.get("clock") != "cpu" or not share:
        return None
    shares = [s for s in (r.metrics.get("cpu_share") for r in recent_main_runs) if s]
    if not shares:
        return None
    usual = statistics.median(shares)
    if share < share_floor * usual:
        return (f"disturbed: it got {share:.0%} of its CPU cores against {usual:.0%} for main's recent runs "
                "(another process was busy on this machine)")
    return None
