"""The pods soak's kind cluster: brought up with the chart and the pods backend (or reused when a
`--keep` run left it), the flavors sized to its node, and torn down."""

import json
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from admissions import GROUP, REPO, VERSION

from devstack.hf_emulator.repos import remove_tree
from devstack.kind import cluster as kind
from devstack.kind import images
from devstack.toolchain.build import ensure_binaries
from graders.assets import build_repos, default_assets_dir, task_builders
from tests.e2e.support import STORE_IN_NODE, Cluster, e2e_values, stage_store

CLUSTER = "posttrain-soak"  # never posttrain-e2e: CI's
NODE = f"{CLUSTER}-control-plane"
RELEASE, NAMESPACE = "soak", "posttrain-soak"
CHART = REPO / "helm" / "posttrain-operator"
TASK = "t0_artifact"  # its jobs mount only small datasets; its grader scores what a job left
# containerd's filters for the containers the soak kills.
OPERATOR_CONTAINER = (
    f'labels."io.kubernetes.container.name"==operator,labels."io.kubernetes.pod.namespace"=={NAMESPACE}'
)
APISERVER_CONTAINER = 'labels."io.kubernetes.container.name"==kube-apiserver'


def flavors(node_memory_mib: int) -> dict[str, dict[str, Any]]:
    """The soak's flavors: small ones, and `soak-big`, of which two fit the node at a time."""
    small = {"cpu": "1", "cpuRequest": "100m", "memory": "512Mi", "shmSize": "64Mi"}
    return {
        "cpu-basic": {**small, "priceMicroUSDPerMinute": 167},
        "cpu-upgrade": {**small, "priceMicroUSDPerMinute": 500},  # the task's grader flavor
        "soak-big": {**small, "memory": f"{int(node_memory_mib * 0.4)}Mi", "priceMicroUSDPerMinute": 334},
    }


# -- the cluster ------------------------------------------------------------------------------------


@dataclass
class Stack:
    workdir: Path
    cluster: Cluster
    flavors: dict[str, dict[str, Any]] = field(default_factory=dict)
    allocatable: dict[str, str] = field(default_factory=dict)

    def node(self, *command: str, check: bool = True) -> str:
        proc = subprocess.run(["docker", "exec", NODE, *command], capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} in {NODE}: {proc.stderr.strip()[:400]}")
        return proc.stdout


WORKDIR = Path(tempfile.gettempdir(), CLUSTER)  # the store, the kubeconfig, what a kept cluster was given


def kept() -> Stack | None:
    """The cluster a run with --keep left, if it is still there."""
    saved = WORKDIR / "stack.json"
    if not (saved.exists() and kind.exists(CLUSTER)):
        return None
    found = json.loads(saved.read_text())
    cluster = Cluster(
        WORKDIR / "kubeconfig", is_kind=True, bin_dir=ensure_binaries(), store_dir=WORKDIR / "store"
    )
    return Stack(WORKDIR, cluster, found["flavors"], found["allocatable"])


def bring_up(reuse: bool) -> Stack:
    """The cluster with the project's images, the store staged, the chart installed (--wait); with
    `reuse`, on the cluster a kept run left if there is one (images and repos already there are not
    loaded again, the chart is upgraded)."""
    bin_dir = ensure_binaries()
    workdir = WORKDIR
    store, kubeconfig = workdir / "store", workdir / "kubeconfig"
    if not (reuse and kubeconfig.exists() and kind.exists(CLUSTER)):
        remove_tree(workdir)
        workdir.mkdir(mode=0o711)
        store.mkdir(mode=0o755)
        kind.create(CLUSTER, kubeconfig, mounts={str(store): STORE_IN_NODE})
    stack = Stack(workdir, Cluster(kubeconfig, is_kind=True, bin_dir=bin_dir, store_dir=store))
    base = images.choose_base()
    operator_image, launcher_image = images.build(images.OPERATOR, base), images.build(images.LAUNCHER, base)
    kind.load_images(CLUSTER, [operator_image, launcher_image])
    # Only the repos of the soak's task: building every task's (a base model's pre-training among
    # them) takes many minutes on a busy machine.
    stage_store(store, build_repos(task_builders(TASK), default_assets_dir(), print))
    cluster = stack.cluster
    node = cluster.json("get", "nodes")["items"][0]
    stack.allocatable = node["status"]["allocatable"]
    memory_mib = int(stack.allocatable["memory"].removesuffix("Ki")) // 1024
    stack.flavors = flavors(memory_mib)
    if not cluster.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found").strip():
        cluster.kubectl("create", "namespace", NAMESPACE)
        token = secrets.token_urlsafe(24)
        cluster.kubectl(
            "-n", NAMESPACE, "create", "secret", "generic", "orchestrator", f"--from-literal=token={token}"
        )  # fmt: skip
    values = e2e_values(operator_image, "http://127.0.0.1:9", "Never", launcher_image)
    values["hfJobs"] = {"enabled": False}
    values["gateway"]["defaultBackend"] = "pods"
    values["pods"]["flavors"] = stack.flavors
    path = workdir / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = cluster.helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(path),
        "--wait", "--timeout", "8m",
    )  # fmt: skip
    if proc.returncode != 0:
        pods = cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "wide", check=False)
        raise RuntimeError(f"helm install failed: {proc.stderr}\n{pods}")
    # The operator lists its tasks in the chart's task policy once it is up; until the API server
    # applies it, every Episode is refused.
    probe = json.dumps({
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Episode", "metadata": {"name": "policy-probe"},
        "spec": {"task": TASK, "budgetUSD": "0.05", "backend": "pods"},
    })  # fmt: skip
    for _ in range(120):
        dry = cluster.run("kubectl", "-n", NAMESPACE, "create", "--dry-run=server", "-f", "-", input=probe)
        if dry.returncode == 0:
            break
        time.sleep(1)
    else:
        raise RuntimeError(f"the task policy never admitted {TASK}: {dry.stderr}")
    (workdir / "stack.json").write_text(
        json.dumps({"flavors": stack.flavors, "allocatable": stack.allocatable})
    )
    return stack


def tear_down(stack: Stack | None, keep: bool) -> None:
    if keep:
        where = f", KUBECONFIG={stack.cluster.kubeconfig}" if stack else ""
        print(f"kept: kind cluster {CLUSTER}{where}", file=sys.stderr)
        return
    kind.delete(CLUSTER)
    if stack is not None:
        remove_tree(stack.workdir)
