"""The Hub's repository API, as much of it as `HfApi` 2.4 uses to publish: `create_repo`,
`upload_folder`/`create_commit` (a preupload call, then the commit with its NDJSON body),
`create_tag`, and the reads around them (`repo_info`, `list_repo_refs`, `list_repo_tree`); and the
file downloads of `hf_hub_download` and `snapshot_download` (`resolve_file`).

File content is taken inline only: preupload answers every file "regular", so the commit carries
it base64-encoded and the client never turns to LFS or Xet (neither can be emulated; the upload
mode is the server's choice, the client only ever forces empty files to "regular"). Writes need
the token's user or one of its orgs as the namespace; reads serve every repo created here, as the
Hub serves public repos to any valid token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devstack.hf_emulator import routes
from devstack.hf_emulator.errors import ApiError
from devstack.hf_emulator.hub_repos import (
    DEFAULT_BRANCH,
    AddFile,
    Commit,
    Delete,
    HubRepo,
    Operation,
    hub_error,
)
from devstack.hf_emulator.job_state import iso_z
from devstack.hf_emulator.validation import (
    COMMIT_OID_RE,
    SpecError,
    check_ref_name,
    check_repo_name,
    check_repo_path,
)

if TYPE_CHECKING:
    from devstack.hf_emulator.surface import Emulator

# The client packs up to 100 MB of file content into one commit and base64 makes that 4/3 larger:
# the default leaves room for the file that crosses the client's budget.
DEFAULT_MAX_COMMIT_BYTES = 256 << 20
MAX_PREUPLOAD_FILES = 1000  # the client asks about 256 at a time
KINDS = {"models": "model", "datasets": "dataset", "spaces": "space"}
WRITABLE_KINDS = ("model", "dataset")
_CREATE_KEYS = {"name", "organization", "type", "private", "visibility"}

Reply = tuple[object, dict[str, str] | None]


def handle(
    emu: Emulator,
    m: routes.Match,
    query: dict[str, list[str]],
    body: bytes,
    base_url: str,
    next_link: Callable[[str], str],
) -> Reply:
    """Serve one of `routes.HUB_ROUTES`; `next_link(cursor)` is the Link header of the next page."""
    try:
        if m.key == routes.CREATE_REPO:
            return _create_repo(emu, _json_object(body), base_url), None
        p = m.params
        kind, namespace = KINDS[p["repo_type"]], p["namespace"]
        repo_id = f"{namespace}/{p['repo']}"
        if m.key in (routes.PREUPLOAD, routes.COMMIT, routes.CREATE_TAG):
            _check_writable(emu, namespace, f"{kind} {repo_id}")
        repo = emu.hub.get(kind, repo_id)
        revision = p.get("revision", DEFAULT_BRANCH)
        if m.key in (routes.REPO_INFO, routes.REPO_INFO_AT):
            return _info(repo, repo.resolve(revision), blobs=_flag(query, "blobs")), None
        if m.key == routes.REPO_REFS:
            return _refs(repo, include_prs=_flag(query, "include_prs")), None
        if m.key in (routes.REPO_TREE_ROOT, routes.REPO_TREE):
            return _tree(emu, repo.resolve(revision), p.get("path", ""), query, next_link)
        if m.key == routes.PREUPLOAD:
            return _preupload(repo.resolve(revision), _json_object(body)), None
        if m.key == routes.COMMIT:
            if _flag(query, "create_pr"):
                raise SpecError("pull requests are not emulated: commit to a branch")
            return _commit(emu, repo, revision, body, base_url), None
        return _tag(emu, repo, revision, _json_object(body)), None
    except SpecError as exc:
        raise hub_error(400, str(exc)) from exc


def resolve_file(emu: Emulator, m: routes.Match) -> tuple[Path, dict[str, str]]:
    """A repo file at a revision, and the headers `hf_hub_download` reads: the commit it resolved to
    and the file's git blob id as its ETag (every file here is regular: see the module docstring)."""
    p = m.params
    kind = KINDS[p["repo_type"]] if "repo_type" in p else "model"
    repo_id = f"{p['namespace']}/{p['repo']}"
    try:
        commit = emu.hub.get(kind, repo_id).resolve(p["revision"])
        path = check_repo_path(p["path"], folder=False)
    except SpecError as exc:
        raise hub_error(400, str(exc)) from exc
    entry = commit.files.get(path)
    on_disk = emu.repos.lookup(kind, repo_id, commit.oid) / path  # hard links the emulator wrote itself
    if entry is None or not on_disk.is_file() or on_disk.is_symlink():
        raise hub_error(404, f"{path} is not in {repo_id} at {commit.oid}", "EntryNotFound")
    return on_disk, {"X-Repo-Commit": commit.oid, "ETag": f'"{entry.oid}"'}


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, [""])[0].lower() in ("1", "true")


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"null")
    except ValueError as exc:
        raise SpecError("the body is not valid JSON") from exc
    if not isinstance(data, dict):
        raise SpecError("the body must be a JSON object")
    return data


def _check_writable(emu: Emulator, namespace: str, what: str) -> None:
    if namespace != emu.namespace and namespace not in emu.orgs:
        raise hub_error(403, f"You don't have the rights to write {what}: {namespace} is not your namespace")


def _url(base_url: str, kind: str, repo_id: str) -> str:
    return f"{base_url}/{repo_id}" if kind == "model" else f"{base_url}/{kind}s/{repo_id}"


def _create_repo(emu: Emulator, payload: dict[str, Any], base_url: str) -> dict[str, Any]:
    unknown = set(payload) - _CREATE_KEYS
    if unknown:
        raise SpecError(f"the emulator does not support {', '.join(sorted(unknown))}")
    kind = payload.get("type") or "model"
    if kind not in WRITABLE_KINDS:
        raise SpecError(f"type must be one of {', '.join(WRITABLE_KINDS)}")
    namespace = payload.get("organization") or emu.namespace
    if not isinstance(namespace, str):
        raise SpecError("organization must be a string")
    name = payload.get("name")
    repo_id = f"{namespace}/{name}"
    _check_writable(emu, namespace, f"{kind} {repo_id}")
    check_repo_name(name)
    visibility = payload.get("visibility")
    if visibility not in (None, "public", "private") or not isinstance(payload.get("private", False), bool):
        raise SpecError("visibility must be public or private")
    private = visibility == "private" or payload.get("private") is True
    url = _url(base_url, kind, repo_id)
    try:
        emu.hub.create(kind, repo_id, private=private)
    except ApiError as exc:
        exc.extra["url"] = url  # `create_repo(exist_ok=True)` returns it from the 409
        raise
    return {"url": url, "name": repo_id, "id": secrets.token_hex(12)}


def _info(repo: HubRepo, commit: Commit, *, blobs: bool) -> dict[str, Any]:
    siblings: list[dict[str, Any]] = []
    for path, entry in sorted(commit.files.items()):
        sibling: dict[str, Any] = {"rfilename": path}
        if blobs:
            sibling.update(size=entry.size, blobId=entry.oid)
        siblings.append(sibling)
    return {
        "_id": repo.repo_id,
        "id": repo.repo_id,
        "author": repo.repo_id.split("/")[0],
        "sha": commit.oid,
        "lastModified": iso_z(commit.at),
        "createdAt": iso_z(repo.created_at),
        "private": repo.private,
        "gated": False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
    }


def _refs(repo: HubRepo, *, include_prs: bool) -> dict[str, Any]:
    def refs(names: dict[str, str], prefix: str) -> list[dict[str, str]]:
        return [{"name": n, "ref": f"{prefix}{n}", "targetCommit": oid} for n, oid in sorted(names.items())]

    data: dict[str, Any] = {
        "branches": refs(repo.branches, "refs/heads/"),
        "tags": refs(repo.tags, "refs/tags/"),
        "converts": [],
    }
    if include_prs:
        data["pullRequests"] = []
    return data


def _tree(
    emu: Emulator, commit: Commit, path: str, query: dict[str, list[str]], next_link: Callable[[str], str]
) -> Reply:
    prefix = check_repo_path(path, folder=True) + "/" if path else ""
    recursive = _flag(query, "recursive")
    folders: dict[str, list[str]] = {}  # folder -> blob ids of its files, for a stable tree id
    files: list[dict[str, Any]] = []
    for file_path, entry in sorted(commit.files.items()):
        if not file_path.startswith(prefix):
            continue
        rest = file_path[len(prefix) :].split("/")
        depth = len(rest) if recursive else 1
        for i in range(1, min(depth, len(rest) - 1) + 1):
            folders.setdefault(prefix + "/".join(rest[:i]), []).append(entry.oid)
        if recursive or len(rest) == 1:
            files.append({"type": "file", "oid": entry.oid, "size": entry.size, "path": file_path})
    if prefix and not files and not folders:
        raise hub_error(404, f"{path} is not a folder at {commit.oid}", "EntryNotFound")
    items = [
        {"type": "directory", "oid": _tree_id(oids), "size": 0, "path": folder}
        for folder, oids in folders.items()
    ]
    items = sorted([*items, *files], key=lambda item: str(item["path"]))
    try:
        offset = int(query.get("cursor", ["0"])[0])
    except ValueError as exc:
        raise SpecError("cursor must be an integer") from exc
    page = items[offset : offset + emu.tree_page_size]
    more = offset + emu.tree_page_size < len(items)
    return page, ({"Link": next_link(str(offset + emu.tree_page_size))} if more else None)


def _tree_id(blob_ids: list[str]) -> str:
    return hashlib.sha1("".join(blob_ids).encode(), usedforsecurity=False).hexdigest()


def _preupload(commit: Commit, payload: dict[str, Any]) -> dict[str, Any]:
    files = payload.get("files")
    if not isinstance(files, list) or len(files) > MAX_PREUPLOAD_FILES:
        raise SpecError(f"files must be an array of at most {MAX_PREUPLOAD_FILES} items")
    answer = []
    for i, item in enumerate(files):
        if not isinstance(item, dict):
            raise SpecError(f"files[{i}] must be an object")
        path = check_repo_path(item.get("path"), f"files[{i}].path")
        size = item.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise SpecError(f"files[{i}].size must be an integer >= 0")
        known = commit.files.get(path)
        entry: dict[str, Any] = {"path": path, "uploadMode": "regular", "shouldIgnore": False}
        if known is not None:
            entry["oid"] = known.oid  # lets the client leave out a file that has not changed
        answer.append(entry)
    return {"files": answer, "commitOid": commit.oid}


def _operations(lines: Iterator[tuple[int, Any]]) -> Iterator[Operation]:
    for n, line in lines:
        key, value = line.get("key"), line.get("value")
        if not isinstance(value, dict):
            raise SpecError(f"line {n}: value must be an object")
        if key == "file":
            path = check_repo_path(value.get("path"), f"line {n}: path")
            content = value.get("content")
            if value.get("encoding") != "base64" or not isinstance(content, str):
                raise SpecError(f"line {n}: a file's content must be a base64 string (encoding base64)")
            try:
                data = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise SpecError(f"line {n}: the content of {path!r} is not valid base64") from exc
            yield AddFile(path, data)
        elif key in ("deletedFile", "deletedFolder"):
            folder = key == "deletedFolder"
            yield Delete(check_repo_path(value.get("path"), f"line {n}: path", folder=folder), folder)
        elif key == "lfsFile":
            raise SpecError(f"line {n}: LFS files are not emulated (preupload answers 'regular')")
        else:
            raise SpecError(f"line {n}: unknown key {str(key)[:50]!r}")


def _ndjson(body: bytes) -> Iterator[tuple[int, Any]]:
    """(line number, object) of each non-empty line, parsed only when reached."""
    for n, raw in enumerate(io.BytesIO(body), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError as exc:
            raise SpecError(f"line {n} of the NDJSON body is not JSON") from exc
        if not isinstance(line, dict):
            raise SpecError(f"line {n} of the NDJSON body is not an object")
        yield n, line


def _commit(emu: Emulator, repo: HubRepo, branch: str, body: bytes, base_url: str) -> dict[str, Any]:
    lines = _ndjson(body)
    first = next(lines, None)
    header = first[1].get("value") if first is not None and first[1].get("key") == "header" else None
    if not isinstance(header, dict):
        raise SpecError("the first line of a commit must be its header ({'key': 'header', ...})")
    summary, parent = header.get("summary"), header.get("parentCommit")
    if not isinstance(summary, str) or not summary.strip():
        raise SpecError("the header's summary (the commit message) must be a non-empty string")
    if parent is not None and (not isinstance(parent, str) or not COMMIT_OID_RE.match(parent)):
        raise SpecError("parentCommit must be a commit id (40 hex characters)")
    commit = emu.hub.commit(repo, branch, summary, parent, _operations(lines))
    url = f"{_url(base_url, repo.kind, repo.repo_id)}/commit/{commit.oid}"
    return {"success": True, "commitOid": commit.oid, "commitUrl": url, "hookOutput": ""}


def _tag(emu: Emulator, repo: HubRepo, revision: str, payload: dict[str, Any]) -> dict[str, Any]:
    tag = check_ref_name(payload.get("tag"), "tag")
    if not isinstance(payload.get("message", ""), str):
        raise SpecError("message must be a string")
    commit = emu.hub.tag(repo, tag, revision)
    return {"name": tag, "ref": f"refs/tags/{tag}", "targetCommit": commit.oid}
