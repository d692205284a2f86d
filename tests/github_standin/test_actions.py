"""The stand-in's GitHub Actions: a dispatched workflow file really runs (expressions, `if:`,
bash steps, checkout, artifacts), runs can be held, lost, cancelled and deleted, and every
request and answer passes the OpenAPI referee."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from github_standin import GitHubStandIn
from github_standin.workflow import condition, evaluate, substitute

WORKFLOW = """\
name: echo
run-name: echo ${{ inputs.word }}
on:
  workflow_dispatch:
    inputs:
      word:
        required: true
      count:
        required: false
        default: "1"
permissions:
  contents: read
jobs:
  echo:
    runs-on: ${{ fromJSON(vars.RUNS_ON || '["self-hosted","gpu"]') }}
    steps:
      - uses: actions/checkout@v4
        with:
          ref: ${{ github.sha }}
      - name: Export
        run: echo "FROM_STEP=yes" >> "$GITHUB_ENV"
      - name: Write
        if: env.FROM_STEP == 'yes'
        env:
          WORD: ${{ inputs.word }}
        run: |
          mkdir -p out
          echo "$WORD x${{ inputs.count }} $GITHUB_RUN_ID $(cat data.txt)" > out/said.txt
          if [ "$WORD" = fail ]; then exit 3; fi
          if [ "$WORD" = sleep ]; then sleep 60; fi
      - name: Skipped after a failure
        run: echo never > out/never.txt
      - uses: actions/upload-artifact@v4
        if: always()
        with:
          name: said-${{ inputs.word }}
          path: |
            out/said.txt
            out/never.txt
"""
FILES = {".github/workflows/echo.yml": WORKFLOW, "data.txt": "from-the-commit\n"}


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[GitHubStandIn]:
    with GitHubStandIn(tmp_path / "github", files=FILES) as gh:
        yield gh
        assert gh.violations == []


@pytest.fixture
def api(standin: GitHubStandIn) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=f"{standin.api_url}/repos/octo-org/research", timeout=30, headers={"Authorization": "token tok-bot"}
    ) as client:
        yield client


def dispatch(api: httpx.Client, **inputs: str) -> dict[str, Any]:
    answer = api.post(
        "/actions/workflows/echo.yml/dispatches", json={"ref": "main", "inputs": inputs, "return_run_details": True}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def artifact_files(api: httpx.Client, run_id: int) -> dict[str, str]:
    listed = api.get(f"/actions/runs/{run_id}/artifacts").json()
    assert listed["total_count"] == 1
    redirect = api.get(listed["artifacts"][0]["archive_download_url"])
    assert redirect.status_code == 302
    blob = httpx.get(redirect.headers["location"])  # storage needs no token: the URL is signed
    with zipfile.ZipFile(io.BytesIO(blob.content)) as archive:
        return {name: archive.read(name).decode() for name in archive.namelist()}


def test_a_dispatched_workflow_runs_its_steps_and_keeps_the_artifact(standin: GitHubStandIn, api: httpx.Client) -> None:
    details = dispatch(api, word="hello", count="2")
    run_id = details["workflow_run_id"]
    assert details["html_url"].endswith(f"/octo-org/research/actions/runs/{run_id}")
    standin.actions.wait(run_id)
    run = api.get(f"/actions/runs/{run_id}").json()
    assert (run["status"], run["conclusion"], run["display_title"]) == ("completed", "success", "echo hello")
    assert run["head_sha"] == standin.ref("main")
    files = artifact_files(api, run_id)
    assert files == {"said.txt": f"hello x2 {run_id} from-the-commit\n", "never.txt": "never\n"}


def test_a_failed_step_skips_the_rest_but_always_steps_still_run(standin: GitHubStandIn, api: httpx.Client) -> None:
    run_id = dispatch(api, word="fail")["workflow_run_id"]
    assert standin.actions.wait(run_id).conclusion == "failure"
    assert artifact_files(api, run_id) == {"said.txt": f"fail x1 {run_id} from-the-commit\n"}


def test_dispatch_refuses_what_github_refuses(standin: GitHubStandIn, api: httpx.Client) -> None:
    unexpected = api.post("/actions/workflows/echo.yml/dispatches", json={"ref": "main", "inputs": {"x": "1"}})
    missing = api.post("/actions/workflows/echo.yml/dispatches", json={"ref": "main", "inputs": {}})
    no_file = api.post("/actions/workflows/other.yml/dispatches", json={"ref": "main"})
    no_ref = api.post("/actions/workflows/echo.yml/dispatches", json={"ref": "nope", "inputs": {"word": "a"}})
    assert [unexpected.status_code, missing.status_code, no_file.status_code, no_ref.status_code] == [
        422,
        422,
        404,
        422,
    ]
    assert "Unexpected inputs provided" in unexpected.json()["message"]
    plain = api.post("/actions/workflows/echo.yml/dispatches", json={"ref": "main", "inputs": {"word": "a"}})
    assert plain.status_code == 204 and plain.content == b""


def test_a_held_run_stays_queued_until_released(standin: GitHubStandIn, api: httpx.Client) -> None:
    standin.actions.hold()
    run_id = dispatch(api, word="later")["workflow_run_id"]
    assert api.get(f"/actions/runs/{run_id}").json()["status"] == "queued"
    standin.actions.release()
    assert standin.actions.wait(run_id).conclusion == "success"


def test_runs_on_labels_no_runner_has_stay_queued(standin: GitHubStandIn, api: httpx.Client) -> None:
    standin.actions.variables["RUNS_ON"] = '["self-hosted", "tpu"]'
    run_id = dispatch(api, word="nowhere")["workflow_run_id"]
    standin.actions.variables.pop("RUNS_ON")  # runs-on is read when a runner looks: now the run fits
    assert standin.actions.wait(run_id).conclusion == "success"


def test_a_lost_run_fails_without_running_a_step(standin: GitHubStandIn, api: httpx.Client) -> None:
    standin.actions.lose()
    run_id = dispatch(api, word="gone")["workflow_run_id"]
    assert standin.actions.wait(run_id).conclusion == "failure"
    assert api.get(f"/actions/runs/{run_id}/artifacts").json() == {"total_count": 0, "artifacts": []}


def test_cancelling_ends_a_running_step_and_a_completed_run_answers_409(
    standin: GitHubStandIn, api: httpx.Client
) -> None:
    run_id = dispatch(api, word="sleep")["workflow_run_id"]
    standin.actions.wait(run_id, "in_progress")
    assert api.post(f"/actions/runs/{run_id}/cancel").status_code == 202
    assert standin.actions.wait(run_id).conclusion == "cancelled"
    assert api.post(f"/actions/runs/{run_id}/cancel").status_code == 409
    assert api.delete(f"/actions/runs/{run_id}").status_code == 204
    assert api.get(f"/actions/runs/{run_id}").status_code == 404


def test_expressions_read_as_github_reads_them() -> None:
    contexts = {"vars": {}, "env": {"A": "1"}, "inputs": {"n": "3"}}
    assert evaluate('fromJSON(vars.X || \'["self-hosted","gpu"]\')', contexts) == ["self-hosted", "gpu"]
    assert substitute("run ${{ inputs.n }} of ${{ inputs.missing }}!", contexts) == "run 3 of !"
    assert evaluate("env.A != '1'", contexts) is False and evaluate("env.B != '1'", contexts) is True
    assert evaluate("'Yes' == 'yes'", contexts) is True  # strings compare ignoring case
    failed = {"always": True, "success": False, "failure": True, "cancelled": False}
    assert condition("env.A == '1'", contexts, failed.__getitem__) is False  # an implicit success()
    assert condition("always()", contexts, failed.__getitem__) is True
    assert condition("${{ failure() && env.A == '1' }}", contexts, failed.__getitem__) is True
