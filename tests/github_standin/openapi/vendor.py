"""Cut the slice of GitHub's OpenAPI description that the stand-in serves out of the npm package
`@octokit/openapi` (file `generated/api.github.com.json`) into `api.github.com.subset.json`.

The slice keeps GitHub's text as published (OpenAPI 3.0, `$ref`s intact): only the operations in
OPERATIONS, the webhook payloads in WEBHOOKS, and the components they reach. Examples and prose
descriptions are dropped to keep the file small; nothing that constrains a value is touched.

    cd /tmp && npm pack @octokit/openapi && tar xzf octokit-openapi-*.tgz
    python tests/github_standin/openapi/vendor.py /tmp/package
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
OUT = HERE / "api.github.com.subset.json"

OPERATIONS = {
    "/app": ["get"],
    "/app/installations/{installation_id}/access_tokens": ["post"],
    "/rate_limit": ["get"],
    "/user": ["get"],
    "/repos/{owner}/{repo}": ["get"],
    "/repos/{owner}/{repo}/installation": ["get"],
    "/repos/{owner}/{repo}/collaborators/{username}/permission": ["get"],
    "/repos/{owner}/{repo}/git/ref/{ref}": ["get"],
    "/repos/{owner}/{repo}/git/matching-refs/{ref}": ["get"],
    "/repos/{owner}/{repo}/git/refs": ["post"],
    "/repos/{owner}/{repo}/git/refs/{ref}": ["patch", "delete"],
    "/repos/{owner}/{repo}/git/commits": ["post"],
    "/repos/{owner}/{repo}/git/commits/{commit_sha}": ["get"],
    "/repos/{owner}/{repo}/git/trees": ["post"],
    "/repos/{owner}/{repo}/git/trees/{tree_sha}": ["get"],
    "/repos/{owner}/{repo}/git/blobs": ["post"],
    "/repos/{owner}/{repo}/git/blobs/{file_sha}": ["get"],
    "/repos/{owner}/{repo}/contents/{path}": ["get", "put"],
    "/repos/{owner}/{repo}/compare/{basehead}": ["get"],
    "/repos/{owner}/{repo}/commits/{ref}": ["get"],
    "/repos/{owner}/{repo}/commits/{ref}/check-runs": ["get"],
    "/repos/{owner}/{repo}/commits/{ref}/statuses": ["get"],
    "/repos/{owner}/{repo}/commits/{ref}/status": ["get"],
    "/repos/{owner}/{repo}/statuses/{sha}": ["post"],
    "/repos/{owner}/{repo}/check-runs": ["post"],
    "/repos/{owner}/{repo}/check-runs/{check_run_id}": ["get", "patch"],
    "/repos/{owner}/{repo}/pulls": ["get", "post"],
    "/repos/{owner}/{repo}/pulls/{pull_number}": ["get", "patch"],
    "/repos/{owner}/{repo}/pulls/{pull_number}/reviews": ["get"],
    "/repos/{owner}/{repo}/issues": ["get", "post"],
    "/repos/{owner}/{repo}/issues/{issue_number}": ["get", "patch"],
    "/repos/{owner}/{repo}/issues/{issue_number}/comments": ["get", "post"],
    "/repos/{owner}/{repo}/issues/{issue_number}/events": ["get"],
    "/repos/{owner}/{repo}/issues/{issue_number}/labels": ["get", "post"],
    "/repos/{owner}/{repo}/issues/{issue_number}/labels/{name}": ["delete"],
    "/repos/{owner}/{repo}/issues/comments": ["get"],
    "/repos/{owner}/{repo}/issues/comments/{comment_id}": ["get", "patch", "delete"],
    "/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions": ["get", "post"],
    "/repos/{owner}/{repo}/labels": ["post"],
    "/repos/{owner}/{repo}/labels/{name}": ["get"],
    "/repos/{owner}/{repo}/actions/workflows/{workflow_id}/dispatches": ["post"],
    "/repos/{owner}/{repo}/actions/runs/{run_id}": ["get", "delete"],
    "/repos/{owner}/{repo}/actions/runs/{run_id}/cancel": ["post"],
    "/repos/{owner}/{repo}/actions/runs/{run_id}/artifacts": ["get"],
    "/repos/{owner}/{repo}/actions/artifacts/{artifact_id}/{archive_format}": ["get"],
}

# x-webhooks entries: "<event>-<action>" as GitHub names them (push has no action)
WEBHOOKS = [
    "push",
    "pull-request-opened", "pull-request-closed", "pull-request-reopened", "pull-request-synchronize",
    "pull-request-labeled", "pull-request-unlabeled", "pull-request-edited",
    "issue-comment-created", "issue-comment-edited", "issue-comment-deleted",
    "check-run-created", "check-run-completed", "check-run-rerequested", "check-run-requested-action",
    "pull-request-review-submitted",
]

DROP = {"examples", "example", "x-github", "x-octokit", "externalDocs", "tags"}


def prune(node: Any, in_schema: bool = False) -> Any:
    """Drop examples and prose; a property literally named `description` inside `properties` stays."""
    if isinstance(node, list):
        return [prune(item, in_schema) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in DROP or (key == "description" and not isinstance(value, dict)):
            continue
        if key == "properties":  # keys below are property names, each mapping to a schema
            out[key] = {name: prune(schema, True) for name, schema in value.items()}
        else:
            out[key] = prune(value, in_schema)
    return out


def refs_in(node: Any) -> set[str]:
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("$ref"), str):
                found.add(item["$ref"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def main(package_dir: str) -> None:
    package = Path(package_dir)
    spec = json.loads((package / "generated" / "api.github.com.json").read_text())
    version = json.loads((package / "package.json").read_text())["version"]
    paths: dict[str, Any] = {}
    for path, methods in OPERATIONS.items():
        item = spec["paths"][path]
        paths[path] = {m: prune(item[m]) for m in methods}
        if "parameters" in item:
            paths[path]["parameters"] = prune(item["parameters"])
    hooks = {}
    for name in WEBHOOKS:
        post = spec["x-webhooks"][name]["post"]
        schema = post["requestBody"]["content"]["application/json"]["schema"]
        hooks[name] = {"post": {"operationId": post.get("operationId"), "requestBody": {
            "content": {"application/json": {"schema": prune(schema)}}}}}
    components: dict[str, dict[str, Any]] = {}
    todo = refs_in(paths) | refs_in(hooks)
    seen: set[str] = set()
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        _, _, kind, name = ref.split("/", 3)  # "#/components/<kind>/<name>"
        target = prune(spec["components"][kind][name])
        components.setdefault(kind, {})[name] = target
        todo |= refs_in(target) - seen
    subset = {
        "openapi": spec["openapi"],
        "info": {"title": spec["info"]["title"], "version": version,
                 "x-vendored-from": f"@octokit/openapi@{version} generated/api.github.com.json",
                 "x-vendored-on": datetime.date.today().isoformat()},
        "paths": paths,
        "x-webhooks": hooks,
        "components": {kind: dict(sorted(items.items())) for kind, items in sorted(components.items())},
    }
    # one value per line: small, and a re-vendoring shows up as a readable diff
    OUT.write_text(json.dumps(subset, indent=0, separators=(",", ":")) + "\n")
    print(f"{OUT}: {len(paths)} paths, {len(hooks)} webhooks, "
          f"{sum(len(v) for v in components.values())} components, {OUT.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/package")
