"""No-follow tree walks: read-only preparation and the publication check never leave the tree."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from devstack.sandbox.trees import (
    MAX_PUBLISHED_DEPTH,
    UnsafeTree,
    check_publishable,
    copy_regular_file,
    make_read_only,
    make_writable,
    remove_tree,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def private_dir(tmp_path: Path) -> Path:
    """A 0700 directory and a 0600 file outside the tree, which links in the tree point to."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    (private / "secret").write_text("s")
    (private / "secret").chmod(0o600)
    return private


def test_make_read_only_skips_links_to_directories_and_files(tmp_path: Path, private_dir: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").write_text("x")
    (tree / "dirlink").symlink_to(private_dir)
    (tree / "sub" / "filelink").symlink_to(private_dir / "secret")

    make_read_only(tree)

    assert mode(tree) == 0o555
    assert mode(tree / "sub") == 0o555
    assert mode(tree / "sub" / "f") == 0o444
    assert mode(private_dir) == 0o700
    assert mode(private_dir / "secret") == 0o600
    # Nothing below the link's target was walked either.
    assert sorted(os.listdir(private_dir)) == ["secret"]


def test_make_read_only_refuses_a_root_that_is_a_link(tmp_path: Path, private_dir: Path) -> None:
    (tmp_path / "root-link").symlink_to(private_dir)
    with pytest.raises(NotADirectoryError):
        make_read_only(tmp_path / "root-link")
    assert mode(private_dir) == 0o700


def test_make_writable_and_remove_tree_leave_link_targets_alone(tmp_path: Path, private_dir: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "link").symlink_to(private_dir)
    make_read_only(tree)
    make_writable(tree)
    assert mode(tree / "sub") == 0o755
    assert mode(private_dir) == 0o700
    remove_tree(tree)
    assert not tree.exists()
    assert (private_dir / "secret").read_text() == "s"


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("abs", "/etc"),
        ("up", "../private"),
        ("sub/up2", "../../private"),
        ("sub/self-abs", "/"),
    ],
)
def test_links_leading_outside_are_refused(tmp_path: Path, link: str, target: str) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / link).symlink_to(target)
    with pytest.raises(UnsafeTree, match="leads outside the output dir"):
        check_publishable(tree)


def test_a_link_that_escapes_only_through_another_link_is_refused(tmp_path: Path) -> None:
    """`a/b/c/top/../x` is `a/b/c/x` lexically, but `top` leads to the root, so `..` leaves the tree."""
    tree = tmp_path / "tree"
    (tree / "a" / "b" / "c").mkdir(parents=True)
    (tree / "a" / "b" / "c" / "top").symlink_to("../../..")
    (tree / "sneaky").symlink_to("a/b/c/top/../x")
    with pytest.raises(UnsafeTree, match="sneaky"):
        check_publishable(tree)


def test_a_link_loop_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "l1").symlink_to("l2")
    (tree / "l2").symlink_to("l1")
    with pytest.raises(UnsafeTree):
        check_publishable(tree)


def test_links_inside_the_tree_are_publishable(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    (tree / "to-b").symlink_to("a/b")
    (tree / "a" / "b" / "to-root").symlink_to("../..")
    (tree / "a" / "dangling").symlink_to("nowhere/deeper")
    (tree / "via-link").symlink_to("to-b/f")
    check_publishable(tree)


def test_fifos_and_sockets_are_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    os.mkfifo(tree / "pipe")
    with pytest.raises(UnsafeTree, match="'pipe' is not a regular file"):
        check_publishable(tree)


def test_depth_is_bounded(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    deep = tree
    for _ in range(MAX_PUBLISHED_DEPTH + 1):
        deep = deep / "d"
    deep.mkdir(parents=True)
    with pytest.raises(UnsafeTree, match="deeper than"):
        check_publishable(tree)


def test_copy_regular_file_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(UnsafeTree):
        copy_regular_file(str(tmp_path / "pipe"), str(tmp_path / "copy"))
    assert not (tmp_path / "copy").exists()


def test_copy_regular_file_refuses_a_link(tmp_path: Path, private_dir: Path) -> None:
    (tmp_path / "link").symlink_to(private_dir / "secret")
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        copy_regular_file(str(tmp_path / "link"), str(tmp_path / "copy"))
    assert not (tmp_path / "copy").exists()
