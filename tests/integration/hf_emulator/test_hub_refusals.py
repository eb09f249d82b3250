"""Bad input to the emulator's Hub repo API gets a clear 4xx and changes nothing; writes outside the
token's namespaces are refused. Requests the client would not send go over raw HTTP."""

from __future__ import annotations

import base64
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from devstack.hf_emulator import HfEmulator

Snapshot = tuple[list[tuple[str, str, str]], list[str], list[tuple[str, str]]]


def file_line(path: str, content: bytes = b"x") -> dict[str, Any]:
    encoded = base64.b64encode(content).decode()
    return {"key": "file", "value": {"path": path, "content": encoded, "encoding": "base64"}}


def ndjson(*lines: dict[str, Any], summary: str = "a commit") -> bytes:
    header = {"key": "header", "value": {"summary": summary, "description": ""}}
    return b"".join(json.dumps(line).encode() + b"\n" for line in (header, *lines))


class Repo:
    """A model repo of the emulator's namespace with `keep.txt` and `sub/a.txt`, tagged v1."""

    def __init__(self, emulator: HfEmulator, data_dir: Path) -> None:
        self.emulator = emulator
        self.api = HfApi(endpoint=emulator.url, token=emulator.token)
        self.repo_id = f"{emulator.namespace}/assets"
        self.api.create_repo(self.repo_id)
        (data_dir / "src" / "sub").mkdir(parents=True)
        (data_dir / "src" / "keep.txt").write_text("keep")
        (data_dir / "src" / "sub" / "a.txt").write_text("a")
        self.head = self.api.upload_folder(folder_path=data_dir / "src", repo_id=self.repo_id).oid
        self.api.create_tag(self.repo_id, tag="v1")

    def post(self, path: str, token: str | None = None, **kwargs: Any) -> httpx2.Response:
        headers = {"Authorization": f"Bearer {token or self.emulator.token}"}
        with httpx2.Client(timeout=30) as client:
            return client.post(f"{self.emulator.url}{path}", headers=headers, **kwargs)

    def commit(self, body: bytes, revision: str = "main", repo_id: str | None = None) -> httpx2.Response:
        return self.post(f"/api/models/{repo_id or self.repo_id}/commit/{revision}", content=body)

    def snapshot(self) -> Snapshot:
        """What a refused request must leave as it was: the store's names, its directories (a
        staging dir left behind would show), and the repo's refs."""
        store = self.emulator.data_dir / "repos"
        on_disk = sorted(f"{kind.name}/{p.name}" for kind in store.iterdir() for p in kind.iterdir())
        refs = self.api.list_repo_refs(self.repo_id)
        return (
            self.emulator.repos.registered(),
            on_disk,
            [(r.ref, r.target_commit) for r in [*refs.branches, *refs.tags]],
        )


@pytest.fixture
def repo(make_emulator: Callable[..., HfEmulator], data_dir: Path) -> Repo:
    return Repo(make_emulator(execute=False), data_dir)


BAD_COMMITS = {
    "a '..' segment": (ndjson(file_line("sub/../../escape.txt")), 400, "'..'"),
    "a leading '..'": (ndjson(file_line("../escape.txt")), 400, "'..'"),
    "an absolute path": (ndjson(file_line("/etc/passwd")), 400, "absolute"),
    "a backslash": (ndjson(file_line("sub\\a.txt")), 400, "backslash"),
    "an empty path": (ndjson(file_line("")), 400, "empty"),
    "an empty segment": (ndjson(file_line("sub//a.txt")), 400, "empty"),
    "a .git/ path": (ndjson(file_line(".git/config")), 400, ".git/"),
    "a nested .git/ path": (ndjson(file_line("sub/.git/hooks/post-checkout")), 400, ".git/"),
    "invalid base64": (
        ndjson({"key": "file", "value": {"path": "b.txt", "content": "no base64!", "encoding": "base64"}}),
        400,
        "base64",
    ),
    "content not base64-encoded": (
        ndjson({"key": "file", "value": {"path": "b.txt", "content": "x", "encoding": "utf-8"}}),
        400,
        "base64",
    ),
    "a line that is not JSON": (ndjson(file_line("b.txt")) + b'{"key": "file", "value": \n', 400, "line 3"),
    "a line that is not an object": (ndjson() + b"[1, 2]\n", 400, "not an object"),
    "no header": (json.dumps(file_line("b.txt")).encode() + b"\n", 400, "header"),
    "an empty body": (b"", 400, "header"),
    "an empty summary": (ndjson(file_line("b.txt"), summary=" "), 400, "summary"),
    "an unknown operation": (ndjson({"key": "rename", "value": {"path": "x"}}), 400, "unknown key"),
    "an LFS file": (ndjson({"key": "lfsFile", "value": {"path": "w.bin", "oid": "0" * 64}}), 400, "LFS"),
    "a file where a folder is": (ndjson(file_line("sub")), 400, "folder"),
    "a folder where a file is": (ndjson(file_line("keep.txt/x")), 400, "is a file"),
    "a bad line after good ones": (ndjson(file_line("new.txt"), file_line("../x")), 400, "'..'"),
    "deleting a missing file": (ndjson({"key": "deletedFile", "value": {"path": "nope"}}), 404, "doesn't"),
    "deleting a missing folder": (ndjson({"key": "deletedFolder", "value": {"path": "no/"}}), 404, "doesn't"),
}


@pytest.mark.parametrize(("body", "status", "says"), BAD_COMMITS.values(), ids=BAD_COMMITS.keys())
def test_a_bad_commit_is_refused_and_changes_nothing(repo: Repo, body: bytes, status: int, says: str) -> None:
    before = repo.snapshot()
    response = repo.commit(body)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]
    assert response.headers["X-Error-Message"] == response.json()["error"]
    assert repo.snapshot() == before
    assert sorted(repo.api.list_repo_files(repo.repo_id)) == [".gitattributes", "keep.txt", "sub/a.txt"]


def test_commits_to_a_missing_repo_or_revision_or_to_a_tag_are_refused(repo: Repo) -> None:
    before = repo.snapshot()
    body = ndjson(file_line("b.txt"))
    missing = repo.commit(body, repo_id=f"{repo.emulator.namespace}/nope")
    assert (missing.status_code, missing.headers["X-Error-Code"]) == (404, "RepoNotFound")
    unknown = repo.commit(body, revision="nope")
    assert (unknown.status_code, unknown.headers["X-Error-Code"]) == (404, "RevisionNotFound")
    assert repo.commit(body, revision="v1").status_code == 400
    assert repo.commit(body + b"", revision=repo.head).status_code == 400
    pr = repo.post(f"/api/models/{repo.repo_id}/commit/main", params={"create_pr": "1"}, content=body)
    assert pr.status_code == 400
    with pytest.raises(RepositoryNotFoundError):
        repo.api.upload_file(path_or_fileobj=b"x", path_in_repo="b", repo_id=f"{repo.emulator.namespace}/no")
    with pytest.raises(RevisionNotFoundError):
        repo.api.repo_info(repo.repo_id, revision="nope")
    with pytest.raises(RepositoryNotFoundError):
        repo.api.repo_info(f"{repo.emulator.namespace}/nope")
    assert repo.snapshot() == before


def test_an_oversize_commit_is_refused_with_413(
    make_emulator: Callable[..., HfEmulator], data_dir: Path
) -> None:
    repo = Repo(make_emulator(execute=False, max_commit_bytes=1 << 20), data_dir)
    before = repo.snapshot()
    (data_dir / "big").mkdir()
    (data_dir / "big" / "weights.bin").write_bytes(os.urandom(900_000))  # 1.2 MB once base64-encoded
    with pytest.raises(HfHubHTTPError) as err:
        repo.api.upload_folder(folder_path=data_dir / "big", repo_id=repo.repo_id)
    assert err.value.response.status_code == 413
    # A body declared far larger than the cap is answered at once, without being read.
    host, port = repo.emulator.url.removeprefix("http://").split(":")
    request = (
        f"POST /api/models/{repo.repo_id}/commit/main HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {repo.emulator.token}\r\nContent-Length: {10 << 30}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(request.encode() + b'{"key": "header"')
        assert conn.recv(100).startswith(b"HTTP/1.1 413 ")
    assert repo.snapshot() == before


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({"tag": "v1"}, "already exists"),
        ({"tag": "main"}, "branch"),
        ({"tag": "bad/name"}, "must be"),
        ({"tag": "-lead"}, "must be"),
        ({"tag": "a..b"}, "must be"),
        ({"tag": "x.lock"}, "must be"),
        ({"tag": "a" * 40}, "commit id"),
        ({"tag": ""}, "must be"),
        ({"tag": 3}, "must be"),
        ({}, "must be"),
    ],
    ids=["existing", "a branch", "slash", "leading dash", "dots", "lock", "hex", "empty", "int", "none"],
)
def test_a_bad_tag_is_refused_and_changes_nothing(repo: Repo, payload: dict[str, Any], says: str) -> None:
    before = repo.snapshot()
    response = repo.post(f"/api/models/{repo.repo_id}/tag/main", json=payload)
    assert response.status_code == (409 if says in ("already exists", "branch") else 400), response.text
    assert says in response.json()["error"]
    assert repo.snapshot() == before


def test_a_tag_at_an_unknown_revision_is_404_and_an_existing_tag_409(repo: Repo) -> None:
    before = repo.snapshot()
    with pytest.raises(RevisionNotFoundError):
        repo.api.create_tag(repo.repo_id, tag="v2", revision="nope")
    with pytest.raises(HfHubHTTPError) as err:
        repo.api.create_tag(repo.repo_id, tag="v1", revision=repo.head)
    assert err.value.response.status_code == 409
    repo.api.create_tag(repo.repo_id, tag="v1", exist_ok=True)  # the client's own choice: no error
    assert repo.snapshot() == before


@pytest.mark.parametrize(
    "payload",
    [
        {"name": "a--b"},
        {"name": "-lead"},
        {"name": "trail."},
        {"name": "a..b"},
        {"name": "x" * 97},
        {"name": "with space"},
        {"name": "name.git"},
        {"name": ""},
        {"name": "ok", "type": "space", "sdk": "gradio"},
        {"name": "ok", "type": "kernel"},
        {"name": "ok", "region": "eu"},
        {"name": "ok", "visibility": "secret"},
    ],
)
def test_a_bad_repo_creation_is_refused_and_changes_nothing(repo: Repo, payload: dict[str, Any]) -> None:
    before = repo.snapshot()
    response = repo.post("/api/repos/create", json=payload)
    assert response.status_code == 400, response.text
    assert repo.snapshot() == before


def test_creating_an_existing_repo_is_409_and_a_bad_preupload_400(repo: Repo, data_dir: Path) -> None:
    before = repo.snapshot()
    with pytest.raises(HfHubHTTPError) as err:
        repo.api.create_repo(repo.repo_id)
    assert err.value.response.status_code == 409
    registered = data_dir / "registered"
    registered.mkdir()
    repo.emulator.repos.register("model", f"{repo.emulator.namespace}/registered", "main", registered)
    from_host = repo.post("/api/repos/create", json={"name": "registered"})
    assert from_host.status_code == 409 and "host directory" in from_host.json()["error"]
    preupload = f"/api/models/{repo.repo_id}/preupload/main"
    bad_path = repo.post(preupload, json={"files": [{"path": "../x", "sample": "", "size": 1}]})
    assert bad_path.status_code == 400
    assert repo.post(preupload, json={"files": [{"path": "x", "size": -1}]}).status_code == 400
    assert repo.post(preupload, content=b"{").status_code == 400
    assert repo.post(f"/api/models/{repo.repo_id}/preupload/nope", json={"files": []}).status_code == 404
    assert repo.snapshot()[2] == before[2]


def test_writes_need_a_valid_token_and_one_of_its_namespaces(repo: Repo, data_dir: Path) -> None:
    before = repo.snapshot()
    bad = HfApi(endpoint=repo.emulator.url, token="hf_wrong")
    for call in (
        lambda: bad.create_repo(f"{repo.emulator.namespace}/other"),
        lambda: bad.upload_folder(folder_path=data_dir / "src", repo_id=repo.repo_id),
        lambda: bad.create_tag(repo.repo_id, tag="v2"),
    ):
        with pytest.raises(HfHubHTTPError) as err:
            call()
        assert err.value.response.status_code == 401
    api = repo.api
    for call in (
        lambda: api.create_repo("someone-else/model"),
        lambda: api.create_repo("someone-else/model", exist_ok=True),
        lambda: api.upload_folder(folder_path=data_dir / "src", repo_id="someone-else/model"),
        lambda: api.create_commit(
            "someone-else/model",
            operations=[CommitOperationAdd(path_in_repo="x", path_or_fileobj=b"x")],
            commit_message="m",
        ),
        lambda: api.create_tag("someone-else/model", tag="v2"),
    ):
        with pytest.raises(HfHubHTTPError) as err:
            call()
        assert err.value.response.status_code == 403
        assert "someone-else" in err.value.response.json()["error"]
    raw = repo.post("/api/repos/create", json={"name": "model", "organization": "someone-else"})
    assert raw.status_code == 403
    assert repo.snapshot() == before
