"""The environment images' locks: each adds to the launcher's packages and replaces none, pins every
package it adds with a hash, and holds exactly what its requirements.in asks for."""

from __future__ import annotations

import re

import pytest

from devstack.kind.environments import (
    ENVIRONMENTS_DIR,
    environment_image,
    environment_names,
    launcher_packages,
    lock_entries,
    normalized,
)
from devstack.kind.images import LAUNCHER, image_key


def test_the_launchers_packages_are_the_closure_of_its_extras_with_their_own_extras() -> None:
    packages = launcher_packages()
    assert {"torch", "transformers", "safetensors", "numpy", "pyseccomp", "pip"} <= set(packages)
    # torch's CUDA libraries come through an extra of cuda-toolkit: followed, not missed.
    assert any(name.startswith("nvidia-cuda-cupti") for name in packages)
    assert "kopf" not in packages and "fastapi" not in packages  # the operator's, not the launcher's


@pytest.mark.parametrize("name", environment_names())
def test_an_environment_lock_adds_to_the_launcher_and_pins_each_package_by_hash(name: str) -> None:
    entries = lock_entries(ENVIRONMENTS_DIR / name / "requirements.lock")
    base = launcher_packages()
    assert entries, "an empty lock"
    assert not set(entries) & set(base), "the lock would replace the launcher's own packages"
    for package, (_, hashes) in entries.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), package
    wanted = (ENVIRONMENTS_DIR / name / "requirements.in").read_text()
    asked = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", wanted, re.M)
    assert asked, "requirements.in pins nothing"
    for package, version in asked:
        assert entries[normalized(package)][0] == version, package


def test_trl_is_an_environment_and_its_image_is_keyed_by_the_launchers() -> None:
    assert "trl" in environment_names()
    image = environment_image("trl")
    assert image.built_on == LAUNCHER and image.repository == "localhost/posttrain-env-trl"
    assert image_key(image, "launcher:a") != image_key(image, "launcher:b")
