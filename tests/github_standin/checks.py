"""GitHub's rules for writing a check run: output size limits, a conclusion whenever the run is
completed (giving a conclusion completes it), and which fields an update may change."""

from __future__ import annotations

from typing import Any

from .errors import invalid
from .events import parse_time
from .model import CheckRun

OUTPUT_LIMIT = 65535  # characters, for each of output.title, output.summary and output.text


def apply(run: CheckRun, fields: dict[str, Any], now: float) -> None:
    """Write `fields` (a create or update body, already schema-checked) onto `run`, or raise
    GitHub's 422 without touching it."""
    output = fields.get("output") or {}
    for key in ("title", "summary", "text"):
        if len(output.get(key) or "") > OUTPUT_LIMIT:
            raise invalid(
                "CheckRun",
                f"output.{key}",
                "custom",
                f"Only {OUTPUT_LIMIT} characters are allowed; {len(output[key])} were supplied.",
            )
    status = "completed" if fields.get("conclusion") else fields.get("status", run.status)
    conclusion = fields.get("conclusion", run.conclusion) if status == "completed" else None
    if (status == "completed" or "completed_at" in fields) and not conclusion:
        raise invalid(
            "CheckRun",
            "conclusion",
            "missing_field",
            "conclusion is required when the status is completed or completed_at is given",
        )
    run.status, run.conclusion = status, conclusion
    for key in ("name", "external_id", "details_url"):
        if key in fields:
            setattr(run, key, fields[key])
    if "started_at" in fields:
        run.started_at = parse_time(fields["started_at"])
    if status == "completed":
        run.completed_at = parse_time(fields["completed_at"]) if "completed_at" in fields else run.completed_at or now
    if output:
        run.output = {**run.output, **{k: output[k] for k in ("title", "summary", "text") if k in output}}
    if "actions" in fields:
        run.actions = fields["actions"]
