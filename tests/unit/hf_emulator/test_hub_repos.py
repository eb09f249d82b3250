"""Commits over the repo store, without HTTP: each commit a whole new tree, its parent's never changed."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.hf_emulator.errors import ApiError
from devstack.hf_emulator.hub_repos import AddFile, Delete, HubRepo, HubRepos, Operation, git_blob_id
from devstack.hf_emulator.repos import RepoStore
from devstack.hf_emulator.validation import SpecError, check_ref_name, check_repo_name, check_repo_path

REPO = "me/assets"


@pytest.fixture
def hub(tmp_path: Path) -> HubRepos:
    return HubRepos(RepoStore(tmp_path / "repos"))


def files_at(hub: HubRepos, revision: str) -> dict[str, bytes]:
    root = hub.store.lookup("model", REPO, revision)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def commit(hub: HubRepos, repo: HubRepo, *ops: Operation) -> str:
    return hub.commit(repo, "main", "a commit", None, ops).oid


def staging_left(hub: HubRepos) -> list[str]:
    return [p.name for p in (hub.store.root / "model").iterdir() if p.name.startswith(".")]


def test_a_new_repo_holds_the_initial_commit_on_main(hub: HubRepos) -> None:
    repo = hub.create("model", REPO, private=False)
    head = repo.branches["main"]
    assert repo.commits[head].parent is None and repo.commits[head].summary == "initial commit"
    assert list(files_at(hub, head)) == [".gitattributes"]
    assert hub.store.lookup("model", REPO, "main") == hub.store.lookup("model", REPO, head)
    with pytest.raises(ApiError) as err:
        hub.create("model", REPO, private=False)
    assert err.value.status == 409
    assert staging_left(hub) == []


def test_an_overwrite_makes_a_new_inode_and_the_parent_keeps_its_file(hub: HubRepos) -> None:
    repo = hub.create("model", REPO, private=False)
    first = commit(hub, repo, AddFile("a/b.txt", b"one"), AddFile("keep.bin", b"\0" * 10))
    second = commit(hub, repo, AddFile("a/b.txt", b"two"))
    assert files_at(hub, first)["a/b.txt"] == b"one"
    assert files_at(hub, second)["a/b.txt"] == b"two"
    old, new = (hub.store.lookup("model", REPO, r) for r in (first, second))
    assert (old / "keep.bin").stat().st_ino == (new / "keep.bin").stat().st_ino  # unchanged: linked
    assert (old / "a/b.txt").stat().st_ino != (new / "a/b.txt").stat().st_ino
    assert stat.S_IMODE((new / "a/b.txt").stat().st_mode) == 0o444
    assert stat.S_IMODE((new / "a").stat().st_mode) == 0o555
    assert repo.commits[second].parent == first
    assert repo.commits[second].files["a/b.txt"].oid == git_blob_id(b"two")
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's empty blob


def test_deletions_remove_files_and_the_folders_they_empty(hub: HubRepos) -> None:
    repo = hub.create("model", REPO, private=False)
    commit(hub, repo, AddFile("x/y/z.txt", b"z"), AddFile("x/w.txt", b"w"), AddFile("d/1", b"1"))
    commit(hub, repo, Delete("x/y/z.txt", folder=False), Delete("d", folder=True))
    assert sorted(files_at(hub, "main")) == [".gitattributes", "x/w.txt"]
    root = hub.store.lookup("model", REPO, "main")
    assert not (root / "x" / "y").exists() and not (root / "d").exists()
    # A folder emptied and filled again in one commit is a folder again.
    commit(hub, repo, Delete("x", folder=True), AddFile("x", b"now a file"))
    assert files_at(hub, "main")["x"] == b"now a file"


def test_a_failing_operation_leaves_no_commit_and_no_staging_dir(hub: HubRepos) -> None:
    repo = hub.create("model", REPO, private=False)
    head = commit(hub, repo, AddFile("a.txt", b"a"))
    registered = hub.store.registered()

    def operations() -> Iterator[Operation]:
        yield AddFile("b.txt", b"b")
        raise SpecError("line 3 is not JSON")

    with pytest.raises(SpecError):
        hub.commit(repo, "main", "broken", None, operations())
    with pytest.raises(SpecError):
        commit(hub, repo, AddFile("a.txt/inside", b"x"))
    with pytest.raises(ApiError) as err:
        hub.commit(repo, "main", "stale", "0" * 40, [AddFile("c.txt", b"c")])
    assert err.value.status == 412
    assert repo.branches["main"] == head and len(repo.commits) == 2
    assert hub.store.registered() == registered
    assert staging_left(hub) == []


def test_a_tag_names_a_commit_once(hub: HubRepos) -> None:
    repo = hub.create("model", REPO, private=False)
    first = commit(hub, repo, AddFile("a.txt", b"a"))
    assert hub.tag(repo, "v1", "main").oid == first
    commit(hub, repo, AddFile("a.txt", b"b"))
    assert files_at(hub, "v1")["a.txt"] == b"a" and files_at(hub, "main")["a.txt"] == b"b"
    for name, revision in (("v1", "main"), ("main", first)):
        with pytest.raises(ApiError) as err:
            hub.tag(repo, name, revision)
        assert err.value.status == 409
    with pytest.raises(ApiError) as err:
        hub.tag(repo, "v2", "nope")
    assert (err.value.status, err.value.headers["X-Error-Code"]) == (404, "RevisionNotFound")


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("a.txt", True),
        ("sub/deep/w.safetensors", True),
        (".gitattributes", True),
        ("sub/.gitignore", True),
        ("", False),
        ("/abs", False),
        ("a/../b", False),
        ("..", False),
        ("./a", False),
        ("a//b", False),
        ("a/", False),
        ("a\\b", False),
        ("a\0b", False),
        (".git/config", False),
        ("x/.git", False),
        (".cache/huggingface", False),
        ("a" * 256, False),
        ("/".join(["a" * 200] * 6), False),
    ],
)
def test_repo_paths(path: str, ok: bool) -> None:
    if ok:
        assert check_repo_path(path) == path
    else:
        with pytest.raises(SpecError):
            check_repo_path(path)


def test_folder_paths_may_end_with_a_slash() -> None:
    assert check_repo_path("sub/", folder=True) == "sub"
    with pytest.raises(SpecError):
        check_repo_path("/", folder=True)


@pytest.mark.parametrize("name", ["ok", "a.b-c_d", "A1", "x" * 96])
def test_good_repo_names(name: str) -> None:
    assert check_repo_name(name) == name


@pytest.mark.parametrize("name", ["", "-a", "a-", ".a", "a.", "a--b", "a..b", "a/b", "x" * 97, "m.git", None])
def test_bad_repo_names(name: object) -> None:
    with pytest.raises(SpecError):
        check_repo_name(name)


@pytest.mark.parametrize("name", ["v1", "local-v2", "v1.0", "release_1"])
def test_good_tags(name: str) -> None:
    assert check_ref_name(name, "tag") == name


@pytest.mark.parametrize("name", ["", "-x", "a/b", "a..b", "x.lock", "a" * 40, "x" * 129, "v1.", 7])
def test_bad_tags(name: object) -> None:
    with pytest.raises(SpecError):
        check_ref_name(name, "tag")
