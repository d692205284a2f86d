"""GitHub's JSON for git data: refs, git commits, trees, blobs, file contents, and the Commits
API's view of a commit with its diff (also used by comparisons)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .gitrepo import CommitInfo, FileChange, Person
from .payloads import b64, html_url, iso, login_for_email, node, repo_url, user

if TYPE_CHECKING:
    from .state import State


def git_ref(st: State, ref: str, sha: str) -> dict[str, Any]:
    kind = st.repo.object_type(sha)
    return {
        "ref": ref,
        "node_id": node("REF", ref),
        "url": repo_url(st, f"/git/{ref}"),
        "object": {"type": kind, "sha": sha, "url": repo_url(st, f"/git/{kind}s/{sha}")},
    }


def _person(p: Person) -> dict[str, Any]:
    return {"name": p.name, "email": p.email, "date": iso(p.when)}


_UNSIGNED = {"verified": False, "reason": "unsigned", "signature": None, "payload": None, "verified_at": None}


def git_commit(st: State, c: CommitInfo) -> dict[str, Any]:
    return {
        "sha": c.sha,
        "node_id": node("C", c.sha),
        "url": repo_url(st, f"/git/commits/{c.sha}"),
        "html_url": html_url(st, f"/commit/{c.sha}"),
        "author": _person(c.author),
        "committer": _person(c.committer),
        "tree": {"sha": c.tree, "url": repo_url(st, f"/git/trees/{c.tree}")},
        "message": c.message,
        "parents": [_parent(st, p) for p in c.parents],
        "verification": dict(_UNSIGNED),
    }


def _parent(st: State, sha: str) -> dict[str, str]:
    return {"sha": sha, "url": repo_url(st, f"/commits/{sha}"), "html_url": html_url(st, f"/commit/{sha}")}


def git_tree(st: State, sha: str, recursive: bool) -> dict[str, Any]:
    items = []
    for e in st.repo.tree(sha, recursive):
        item = {
            "path": e.path,
            "mode": e.mode,
            "type": e.type,
            "sha": e.sha,
            "url": repo_url(st, f"/git/{e.type}s/{e.sha}"),
        }
        if e.size is not None:
            item["size"] = e.size
        items.append(item)
    return {"sha": sha, "url": repo_url(st, f"/git/trees/{sha}"), "tree": items, "truncated": False}


def blob(st: State, sha: str) -> dict[str, Any]:
    data = st.repo.read_blob(sha)
    return {
        "sha": sha,
        "node_id": node("B", sha),
        "url": repo_url(st, f"/git/blobs/{sha}"),
        "size": len(data),
        "content": b64(data),
        "encoding": "base64",
    }


def content(
    st: State, ref: str, path: str, kind: str, sha: str, size: int | None, data: bytes | None = None
) -> dict[str, Any]:
    """An entry of the contents API: a file (with its content when `data` is given) or a dir."""
    self_url = repo_url(st, f"/contents/{path}?ref={ref}")
    git_url = repo_url(st, f"/git/{'blobs' if kind == 'file' else 'trees'}/{sha}")
    html = html_url(st, f"/{'blob' if kind == 'file' else 'tree'}/{ref}/{path}")
    out = {
        "type": kind,
        "size": size or 0,
        "name": path.rsplit("/", 1)[-1],
        "path": path,
        "sha": sha,
        "url": self_url,
        "git_url": git_url,
        "html_url": html,
        "download_url": f"{st.base_url}/_raw/{st.owner}/{st.name}/{ref}/{path}" if kind == "file" else None,
        "_links": {"self": self_url, "git": git_url, "html": html},
    }
    if data is not None:
        out.update(content=b64(data), encoding="base64")
    return out


def diff_entry(st: State, f: FileChange, ref: str) -> dict[str, Any]:
    out = {
        "sha": f.sha,
        "filename": f.filename,
        "status": f.status,
        "additions": f.additions,
        "deletions": f.deletions,
        "changes": f.additions + f.deletions,
        "blob_url": html_url(st, f"/blob/{ref}/{f.filename}"),
        "raw_url": html_url(st, f"/raw/{ref}/{f.filename}"),
        "contents_url": repo_url(st, f"/contents/{f.filename}?ref={ref}"),
    }
    if f.patch is not None:
        out["patch"] = f.patch
    if f.previous_filename:
        out["previous_filename"] = f.previous_filename
    return out


def commit(st: State, c: CommitInfo, with_files: bool = False) -> dict[str, Any]:
    """repos/get-commit: the commit as the Commits API shows it (files and stats on request)."""
    author, committer = login_for_email(c.author.email), login_for_email(c.committer.email)
    out = {
        "url": repo_url(st, f"/commits/{c.sha}"),
        "sha": c.sha,
        "node_id": node("C", c.sha),
        "html_url": html_url(st, f"/commit/{c.sha}"),
        "comments_url": repo_url(st, f"/commits/{c.sha}/comments"),
        "commit": {
            "url": repo_url(st, f"/git/commits/{c.sha}"),
            "author": _person(c.author),
            "committer": _person(c.committer),
            "message": c.message,
            "comment_count": 0,
            "tree": {"sha": c.tree, "url": repo_url(st, f"/git/trees/{c.tree}")},
            "verification": dict(_UNSIGNED),
        },
        "author": user(st, author) if author else None,
        "committer": user(st, committer) if committer else None,
        "parents": [_parent(st, p) for p in c.parents],
    }
    if with_files:
        files = st.repo.changes(c.parents[0] if c.parents else None, c.sha)
        out["files"] = [diff_entry(st, f, c.sha) for f in files]
        plus, minus = sum(f.additions for f in files), sum(f.deletions for f in files)
        out["stats"] = {"additions": plus, "deletions": minus, "total": plus + minus}
    return out


def comparison(
    st: State, basehead: str, base: str, head: str, merge_base: str, page: int, per_page: int
) -> dict[str, Any]:
    """base...head: commits on head since the merge base (one page of them), and the files they change."""
    repo = st.repo
    ahead, behind = repo.rev_list(f"{base}..{head}"), repo.rev_list(f"{head}..{base}")
    status = (
        "identical" if not ahead and not behind else "ahead" if not behind else "behind" if not ahead else "diverged"
    )
    html = html_url(st, f"/compare/{basehead}")
    return {
        "url": repo_url(st, f"/compare/{basehead}"),
        "html_url": html,
        "permalink_url": html_url(st, f"/compare/{base}...{head}"),
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "base_commit": commit(st, repo.read_commit(base)),
        "merge_base_commit": commit(st, repo.read_commit(merge_base)),
        "status": status,
        "ahead_by": len(ahead),
        "behind_by": len(behind),
        "total_commits": len(ahead),
        "commits": [commit(st, repo.read_commit(sha)) for sha in ahead[(page - 1) * per_page : page * per_page]],
        "files": [diff_entry(st, f, head) for f in repo.changes(merge_base, head)],
    }
