"""Shared fixtures: the devstack control plane (once per run, only if a test asks) and namespaces."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.controlplane import cluster as devcluster
from tests.helpers import Kubectl, make_kubectl

_LAYER_BY_DIR = {"unit": "unit", "integration": "integration", "e2e": "e2e"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--devstack-attach",
        metavar="NAME",
        default=os.environ.get("DEVSTACK_ATTACH"),
        help="use the running devstack cluster NAME instead of starting one for this run",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its layer from its folder, so `-m unit` and friends just work."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        for folder, marker in _LAYER_BY_DIR.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[devcluster.ClusterState]:
    attach = request.config.getoption("--devstack-attach")
    if attach:
        state = devcluster.load_state(attach)
        if state is None or not all(devcluster.component_status(state).values()):
            pytest.fail(f"--devstack-attach {attach}: no running cluster by that name")
        yield state
        return
    name = f"pytest-{os.getpid()}"
    state = devcluster.up(name)
    try:
        yield state
    finally:
        devcluster.down(name)


@pytest.fixture(scope="session")
def kubectl(cluster: devcluster.ClusterState) -> Kubectl:
    return make_kubectl(cluster)


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards without waiting for it to finish."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)
