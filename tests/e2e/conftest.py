"""The e2e layer: the Helm-installed chart, from the project's own images, on a cluster with a node.

By default the session creates a kind cluster (`devstack/kind/cluster.py`: the official node image where
Docker can pull it, else the one built here), loads the images with `kind load`, installs the chart
with `helm install --wait`, and deletes the cluster at the end. Any other cluster works too:

    E2E_KUBECONFIG=~/.kube/config E2E_OPERATOR_IMAGE=registry.example/posttrain-operator:0.1.0 \\
    E2E_HOST_ADDRESS=10.0.0.5 pytest tests/e2e

(the image must be pullable by the cluster, and E2E_HOST_ADDRESS is where its pods reach this
machine, on which the tests run the HF Jobs emulator). E2E_KEEP_CLUSTER=1 keeps the kind cluster and
its release, and a later session with it set reuses them (the chart upgraded in place);
E2E_CLUSTER_NAME names it (default posttrain-e2e), so two checkouts on one Docker host do not collide.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from posttrain_launcher.host import job_interpreter

from devstack.hf_emulator import HfEmulator
from devstack.hf_emulator.repos import remove_tree
from devstack.kind import cluster as kind
from devstack.kind import environments, images
from devstack.toolchain.build import ensure_binaries
from graders.assets import materialize_assets
from tests.e2e.support import (
    BUCKET,
    CLUSTER_NAME,
    HF_NAMESPACE,
    HF_TOKEN,
    NAMESPACE,
    PROBE_DEPENDENCY,
    PROBE_DEPENDENCY_VERSION,
    PROBE_PACKAGE,
    PROBE_VERSION,
    RELEASE,
    STORE_IN_NODE,
    Canary,
    Cluster,
    Release,
    e2e_values,
    install_chart,
    say,
    stage_store,
)
from tests.gsm8k_standin import standin_registry
from tests.helpers import wait_for
from tests.package_index import PackageIndex, build_wheel, serve_index


@pytest.fixture(scope="session")
def e2e_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    bin_dir = ensure_binaries()
    given = os.environ.get("E2E_KUBECONFIG")
    if given:
        yield Cluster(Path(given).expanduser(), is_kind=False, bin_dir=bin_dir)
        return
    keep = os.environ.get("E2E_KEEP_CLUSTER") == "1"
    # A kept cluster's files live at a name derived from the cluster's, so a later session finds them.
    workdir = Path(tempfile.gettempdir(), f"posttrain-e2e-{CLUSTER_NAME}")
    store, kubeconfig = workdir / "store", workdir / "kubeconfig"
    if not (keep and kubeconfig.exists() and kind.exists(CLUSTER_NAME)):
        remove_tree(workdir)
        workdir.mkdir(mode=0o711)
        store.mkdir(mode=0o755)
        kind.create(CLUSTER_NAME, kubeconfig, mounts={str(store): STORE_IN_NODE})
    cluster = Cluster(kubeconfig, is_kind=True, bin_dir=bin_dir, store_dir=store)
    try:
        nodes = cluster.kubectl("get", "nodes", "-o", "wide")
        say(request.config, f"\nkind cluster {CLUSTER_NAME}:\n{nodes}")
        yield cluster
    finally:
        if not keep:
            kind.delete(CLUSTER_NAME)
            remove_tree(workdir)


@pytest.fixture(scope="session")
def operator_image(e2e_cluster: Cluster) -> str:
    given = os.environ.get("E2E_OPERATOR_IMAGE")
    if given:
        return given
    tag = images.build(images.OPERATOR, images.choose_base())
    if e2e_cluster.is_kind:
        kind.load_images(CLUSTER_NAME, [tag])
    return tag


@pytest.fixture(scope="session")
def launcher_image(e2e_cluster: Cluster) -> str | None:
    """The image of the pods backend's jobs (kind only: elsewhere the pods backend stays off)."""
    if not e2e_cluster.is_kind:
        return None
    tag = images.build(images.LAUNCHER, images.choose_base())
    kind.load_images(CLUSTER_NAME, [tag])
    return tag


@pytest.fixture(scope="session")
def environment_images(e2e_cluster: Cluster, launcher_image: str | None) -> dict[str, str]:
    """The environment images (built on the launcher's) by name, loaded for the pods backend (kind
    only, like the launcher's image)."""
    if launcher_image is None:
        return {}
    base = images.choose_base()
    names = environments.environment_names()
    tags = {name: images.build(environments.environment_image(name), base) for name in names}
    kind.load_images(CLUSTER_NAME, list(tags.values()))
    return tags


@pytest.fixture(scope="session")
def host_address(e2e_cluster: Cluster) -> str:
    """Where the cluster's pods reach this machine (the host side of the kind network)."""
    given = os.environ.get("E2E_HOST_ADDRESS")
    if given:
        return given
    if not e2e_cluster.is_kind:
        pytest.fail("E2E_HOST_ADDRESS is needed with E2E_KUBECONFIG: where pods reach this machine")
    return kind.host_address(CLUSTER_NAME)


@pytest.fixture(scope="session")
def canary(host_address: str) -> Iterator[Canary]:
    server = socket.create_server((host_address, 0))
    found = Canary(host_address, int(server.getsockname()[1]))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                found.accepted += 1
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield found
    finally:
        server.close()


@pytest.fixture(scope="session")
def package_index(host_address: str) -> Iterator[PackageIndex]:
    """The operator's package index (`pods.packageIndex`), on the host side of the kind network."""
    wheels = Path(tempfile.mkdtemp(prefix="e2e-wheels-"))
    source = "from ptprobedep import VALUE\n"
    requires = [f"{PROBE_DEPENDENCY}>=2", "numpy>=1"]
    wheel = build_wheel(wheels, PROBE_PACKAGE, PROBE_VERSION, source, requires=requires)
    value = "VALUE = 'staged by the operator'\n"
    dependency = build_wheel(wheels, PROBE_DEPENDENCY, PROBE_DEPENDENCY_VERSION, value)
    with serve_index(host_address, {PROBE_PACKAGE: [wheel], PROBE_DEPENDENCY: [dependency]}) as index:
        yield index
    shutil.rmtree(wheels, ignore_errors=True)


@pytest.fixture(scope="session")
def hf_emulator(host_address: str) -> Iterator[HfEmulator]:
    """The HF Jobs emulator on the host, reachable from the cluster, running jobs under the launcher."""
    # Not pytest's tmp dir: it is 0700 and the launcher's uid 10000 must reach the job trees.
    data_dir = Path(tempfile.mkdtemp(prefix="hf-emulator-e2e-"))
    data_dir.chmod(0o711)
    (data_dir / "interpreter").mkdir(mode=0o755)
    emulator = HfEmulator(
        data_dir,
        host=host_address,
        token=HF_TOKEN,
        namespace=HF_NAMESPACE,
        interpreter=job_interpreter(str(data_dir / "interpreter")),
    ).start()
    emulator.create_bucket(BUCKET)
    with standin_registry():
        repos = materialize_assets()
    for repo in repos:
        emulator.repos.register(repo.ref.kind, repo.ref.repo_id, repo.ref.revision, repo.path)
    try:
        yield emulator
    finally:
        emulator.stop()
        remove_tree(data_dir)


@pytest.fixture(scope="session")
def release(
    request: pytest.FixtureRequest,
    e2e_cluster: Cluster,
    operator_image: str,
    launcher_image: str | None,
    hf_emulator: HfEmulator,
    canary: Canary,
    package_index: PackageIndex,
    environment_images: dict[str, str],
) -> Iterator[Release]:
    """The chart installed with `helm install --wait`, and the Secrets it references; on kind with
    the pods backend enabled too, its store staged."""
    cluster = e2e_cluster
    if cluster.store_dir is not None:
        stage_store(cluster.store_dir)
    reused = bool(cluster.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found").strip())
    if reused:  # a kept release: its gateway already holds this token
        token = cluster.json("-n", NAMESPACE, "get", "secret", "orchestrator")["data"]["token"]
        orchestrator_token = base64.b64decode(token).decode()
    else:
        cluster.kubectl("create", "namespace", NAMESPACE)
        orchestrator_token = secrets.token_urlsafe(24)
    for name, value in () if reused else (("hf-token", HF_TOKEN), ("orchestrator", orchestrator_token)):
        cluster.kubectl("-n", NAMESPACE, "create", "secret", "generic", name, f"--from-literal=token={value}")
    pull_policy = "Never" if cluster.is_kind else "IfNotPresent"
    values = e2e_values(
        operator_image,
        hf_emulator.url,
        pull_policy,
        launcher_image,
        canary,
        package_index.url,
        environment_images,
    )
    install_seconds = install_chart(cluster, values)
    say(
        request.config,
        f"\nhelm install --wait: {install_seconds:.0f}s\n"
        + cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "wide"),
    )
    # The operator listed its tasks in the chart's task policy before it reported ready; the API
    # server applies the change a moment later, and until then refuses every Episode.
    probe = json.dumps({
        "apiVersion": "posttrain.dev/v1alpha1", "kind": "Episode", "metadata": {"name": "policy-probe"},
        "spec": {"task": "t0_artifact", "budgetUSD": "0.05", "backend": "hf-jobs"},
    })  # fmt: skip
    wait_for(
        lambda: cluster.run("kubectl", "-n", NAMESPACE, "create", "--dry-run=server", "-f", "-",
                            input=probe).returncode == 0,
        timeout=60, what="the task policy to admit a registered task",
    )  # fmt: skip
    try:
        yield Release(cluster, NAMESPACE, orchestrator_token, operator_image, install_seconds, values)
    finally:
        if os.environ.get("E2E_KEEP_CLUSTER") == "1":
            say(request.config, f"\nkept: release {RELEASE} in {NAMESPACE}, KUBECONFIG={cluster.kubeconfig}")
        else:
            cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
