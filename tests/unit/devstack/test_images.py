"""The project images' build keys, and the free-space guard in front of builds and loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from devstack.kind import images
from devstack.toolchain.build import BuildError


def test_a_step_that_cannot_fit_fails_first_saying_how_much_it_needs(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(
        BuildError, match=r"docker build x needs about \d+ GiB free under .*docker image prune"
    ):
        images.require_free_space(tmp_path, free + (64 << 30), "docker build x")
    images.require_free_space(tmp_path, 1, "docker build x")  # fits: no error


def test_the_key_is_stable_and_changes_with_the_base_and_the_image() -> None:
    key = images.image_key(images.LAUNCHER, "base:1")
    assert key == images.image_key(images.LAUNCHER, "base:1")
    assert key != images.image_key(images.LAUNCHER, "base:2")
    assert key != images.image_key(images.OPERATOR, "base:1")
    assert images.LAUNCHER.build_space_gb > images.OPERATOR.build_space_gb
