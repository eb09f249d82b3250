"""The real huggingface_hub 2.4 client publishes repos to the emulator (create_repo, upload_folder,
create_commit, create_tag), and jobs mount exactly the files of the commit or tag they name."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, Volume
from huggingface_hub.errors import HfHubHTTPError

from devstack.hf_emulator import HfEmulator, routes
from devstack.hf_emulator.hub_repos import GITATTRIBUTES

from .test_jobs_api import run, wait_terminal

LIST_FILES = (
    "import hashlib, os, pathlib\n"
    "root = pathlib.Path(os.environ['POSTTRAIN_ROOT']) / 'inputs' / 'repo'\n"
    "for p in sorted(root.rglob('*')):\n"
    "    if p.is_file():\n"
    "        print(p.relative_to(root), hashlib.sha256(p.read_bytes()).hexdigest()[:16])\n"
)


def folder(root: Path, files: dict[str, bytes]) -> Path:
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    return root


def stored(emulator: HfEmulator, kind: str, repo_id: str, revision: str) -> dict[str, bytes]:
    root = emulator.repos.lookup(kind, repo_id, revision)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def listing(files: dict[str, bytes]) -> list[str]:
    return [f"{rel} {hashlib.sha256(content).hexdigest()[:16]}" for rel, content in sorted(files.items())]


def mounted_listing(api: HfApi, emulator: HfEmulator, kind: str, repo_id: str, revision: str) -> list[str]:
    volume = Volume(type=kind, source=repo_id, mount_path="/inputs/repo", revision=revision)  # type: ignore[arg-type]
    job = run(api, emulator, LIST_FILES, volumes=[volume])
    done = wait_terminal(api, emulator, job.id)
    assert done.status.stage == "COMPLETED", done.status.message
    return list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace))


@pytest.fixture
def v1_files() -> dict[str, bytes]:
    return {
        "config.json": b'{"hidden": 8}',
        "model.safetensors": os.urandom(2_400_000),  # sent inline, base64-encoded, like every file
        "sub/deep/notes.txt": "r\u00e9sum\u00e9\n".encode(),
        "sub/empty.bin": b"",
    }


def test_a_published_folder_is_mounted_at_its_tag_and_its_commit(
    api: HfApi, emulator: HfEmulator, data_dir: Path, v1_files: dict[str, bytes]
) -> None:
    repo_id = f"{emulator.namespace}/tiny-model"
    url = api.create_repo(repo_id, repo_type="model", exist_ok=True)
    assert url.repo_id == repo_id and url.repo_type == "model"
    assert api.create_repo(repo_id, repo_type="model", exist_ok=True) == url  # again: the same repo
    initial = api.repo_info(repo_id, repo_type="model").sha
    assert initial is not None and len(initial) == 40

    source = folder(data_dir / "v1", v1_files)
    info = api.upload_folder(folder_path=source, repo_id=repo_id, repo_type="model")
    assert len(info.oid) == 40 and info.oid != initial
    assert info.repo_url.repo_id == repo_id
    api.create_tag(repo_id, tag="local-v1", repo_type="model", revision=info.oid)

    refs = api.list_repo_refs(repo_id, repo_type="model")
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", info.oid)]
    tags = [(t.name, t.ref, t.target_commit) for t in refs.tags]
    assert tags == [("local-v1", "refs/tags/local-v1", info.oid)]
    at_tag = api.repo_info(repo_id, repo_type="model", revision="local-v1", files_metadata=True)
    assert at_tag.sha == info.oid
    want = {**v1_files, ".gitattributes": GITATTRIBUTES.encode()}  # the Hub's initial commit
    assert at_tag.siblings is not None
    assert {s.rfilename: s.size for s in at_tag.siblings} == {k: len(v) for k, v in want.items()}
    assert sorted(api.list_repo_files(repo_id, repo_type="model", revision="local-v1")) == sorted(want)

    for revision in ("local-v1", info.oid, "main"):
        assert stored(emulator, "model", repo_id, revision) == want
    tree = emulator.repos.lookup("model", repo_id, "local-v1")
    assert tree == emulator.repos.lookup("model", repo_id, info.oid)  # one tree, several names
    assert stat.S_IMODE((tree / "model.safetensors").stat().st_mode) == 0o444
    assert stat.S_IMODE((tree / "sub" / "deep").stat().st_mode) == 0o555
    assert stat.S_IMODE((emulator.data_dir / "repos").stat().st_mode) == 0o700

    # A job sees exactly those files, at the tag and at the commit.
    assert mounted_listing(api, emulator, "model", repo_id, "local-v1") == listing(want)
    assert mounted_listing(api, emulator, "model", repo_id, info.oid) == listing(want)
    assert emulator.request_count(routes.COMMIT) == 1 and emulator.request_count(routes.PREUPLOAD) == 1

    if os.geteuid() != 0:
        pytest.skip("the store's files are root-owned (out of a job's reach) only when the emulator is root")
    assert (tree / "model.safetensors").stat().st_uid == 0


def test_a_second_commit_is_a_new_revision_and_the_tag_keeps_the_old_files(
    api: HfApi, emulator: HfEmulator, data_dir: Path, v1_files: dict[str, bytes]
) -> None:
    repo_id = f"{emulator.namespace}/splits"
    api.create_repo(repo_id, repo_type="dataset")
    source = folder(data_dir / "v1", v1_files)
    v1 = api.upload_folder(folder_path=source, repo_id=repo_id, repo_type="dataset")
    api.create_tag(repo_id, tag="v1", repo_type="dataset")  # at main, which is v1

    # Re-uploading the same folder changes nothing: the client leaves out files whose oid matches.
    same = api.upload_folder(folder_path=source, repo_id=repo_id, repo_type="dataset")
    assert same.oid == v1.oid
    assert emulator.request_count(routes.COMMIT) == 1

    v2 = api.create_commit(
        repo_id,
        repo_type="dataset",
        commit_message="v2: new config, no notes",
        operations=[
            CommitOperationAdd(path_in_repo="config.json", path_or_fileobj=b'{"hidden": 16}'),
            CommitOperationAdd(path_in_repo="data/train.jsonl", path_or_fileobj=b'{"x": 1}\n'),
            CommitOperationDelete(path_in_repo="sub/deep/"),
            CommitOperationDelete(path_in_repo="sub/empty.bin"),
        ],
    )
    assert v2.oid not in (v1.oid, None)
    v1_want = {**v1_files, ".gitattributes": GITATTRIBUTES.encode()}
    v2_want = {
        ".gitattributes": GITATTRIBUTES.encode(),
        "config.json": b'{"hidden": 16}',
        "data/train.jsonl": b'{"x": 1}\n',
        "model.safetensors": v1_files["model.safetensors"],
    }
    assert stored(emulator, "dataset", repo_id, "v1") == v1_want
    assert stored(emulator, "dataset", repo_id, v1.oid) == v1_want
    assert stored(emulator, "dataset", repo_id, "main") == v2_want
    assert stored(emulator, "dataset", repo_id, v2.oid) == v2_want
    assert not (emulator.repos.lookup("dataset", repo_id, v2.oid) / "sub").exists()  # no empty folders
    assert api.dataset_info(repo_id).sha == v2.oid
    assert api.dataset_info(repo_id, revision="v1").sha == v1.oid
    refs = api.list_repo_refs(repo_id, repo_type="dataset")
    named = [(r.name, r.target_commit) for r in [*refs.branches, *refs.tags]]
    assert named == [("main", v2.oid), ("v1", v1.oid)]

    assert mounted_listing(api, emulator, "dataset", repo_id, "v1") == listing(v1_want)
    assert mounted_listing(api, emulator, "dataset", repo_id, "main") == listing(v2_want)

    # A commit based on a parent that is no longer the head is refused, and changes nothing.
    with pytest.raises(HfHubHTTPError) as err:
        api.create_commit(
            repo_id,
            repo_type="dataset",
            commit_message="stale",
            parent_commit=v1.oid,
            operations=[CommitOperationAdd(path_in_repo="x.txt", path_or_fileobj=b"x")],
        )
    assert err.value.response.status_code == 412
    assert api.dataset_info(repo_id).sha == v2.oid


def test_an_org_namespace_is_writable_and_requests_are_counted_and_faulted(
    make_emulator: Callable[..., HfEmulator], data_dir: Path
) -> None:
    emulator = make_emulator(orgs=("team",), execute=False)
    api = HfApi(endpoint=emulator.url, token=emulator.token)
    api.create_repo("team/base", repo_type="model")
    # The client retries a preupload or commit that fails with a 5xx; each try is counted.
    emulator.controls.inject("http_error", route=routes.PREUPLOAD, status=503, count=1)
    emulator.controls.inject("http_error", route=routes.COMMIT, status=502, count=1)
    info = api.upload_folder(folder_path=folder(data_dir / "src", {"a.txt": b"a"}), repo_id="team/base")
    assert emulator.request_count(routes.PREUPLOAD) == 2 and emulator.request_count(routes.COMMIT) == 2
    assert api.model_info("team/base").sha == info.oid
    assert stored(emulator, "model", "team/base", info.oid)["a.txt"] == b"a"
