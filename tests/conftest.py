"""Shared fixtures: the devstack control plane (once per run, only if a test asks) and namespaces."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from posttrain_operator.api.models import GROUP, VERSION

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
    """Mark each test with its layer from its folder, so `-m unit` and friends just work; then put the
    files that hold a `slow` test first. `make test` hands files to its workers in this order
    (`--no-loadscope-reorder`): a long file started last would run alone while the other worker idles."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        for folder, marker in _LAYER_BY_DIR.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, marker))
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the order within stays


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


@pytest.fixture(scope="session")
def finalizer_release(cluster: devcluster.ClusterState) -> Callable[[str], None]:
    """Takes every finalizer off a test namespace's objects, for its clean-up.

    The operator that put them there has stopped by then (its fixture ends first), so they would hold
    the namespace Terminating for the rest of the run, and the namespace controller would retry
    each such namespace every few seconds: a few hundred of them, a busy API server."""
    from kubernetes import client, config  # the CLI's client, in the full venv only

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    release = {"metadata": {"finalizers": None}}

    def release_all(namespace: str) -> None:
        for plural in ("agentjobs", "episodes"):
            try:
                listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
            except client.ApiException as exc:
                if exc.status == 404:  # no CRDs in this cluster (a file run alone that installs none)
                    continue
                raise
            for item in listed["items"]:
                if item["metadata"].get("finalizers"):
                    name = item["metadata"]["name"]
                    with contextlib.suppress(client.ApiException):
                        custom.patch_namespaced_custom_object(
                            GROUP, VERSION, namespace, plural, name, release
                        )
        for pod in core.list_namespaced_pod(namespace).items:
            if pod.metadata.finalizers:
                with contextlib.suppress(client.ApiException):
                    core.patch_namespaced_pod(pod.metadata.name, namespace, release)

    return release_all


@pytest.fixture
def namespace(kubectl: Kubectl, finalizer_release: Callable[[str], None]) -> Iterator[str]:
    """A fresh namespace per test, its objects' finalizers released and the namespace deleted
    afterwards, without waiting for it to finish."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl("create", "namespace", name)
    yield name
    finalizer_release(name)
    kubectl("delete", "namespace", name, "--wait=false", check=False)
