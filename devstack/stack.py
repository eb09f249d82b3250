"""The whole system on one machine: the control plane, the HF Jobs emulator (running every job for
real under the launcher), the operator and the gateway, as background processes.

`python -m devstack stack up` starts what is not running and prints how to reach it;
`python -m devstack stack down` stops everything, the cluster included.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from devstack.controlplane import cluster
from devstack.hf_emulator.repos import remove_tree
from devstack.operator_env import operator_env
from devstack.toolchain.build import log
from devstack.toolchain.paths import KUBERNETES_VERSION, bin_dir, run_root

if TYPE_CHECKING:
    from graders.assets import LocalRepo

REPO = Path(__file__).resolve().parents[1]
HF_NAMESPACE = "posttrain-dev"
BUCKET = f"{HF_NAMESPACE}/posttrain-outputs"
SYSTEM_NAMESPACE = "posttrain-system"
# The chart's release as `make up` installs its cluster-level part (fullname "posttrain-operator").
RELEASE = "posttrain-operator"
OPERATOR_SA = f"{RELEASE}-operator"
GATEWAY_SA = f"{RELEASE}-gateway"
CHART = REPO / "helm" / "posttrain-operator"
# What `make up` takes from the chart: identities, RBAC and admission, so the local stack refuses what
# a cluster with the chart refuses. Deployments, Services and NetworkPolicies stay with processes here.
CLUSTER_LEVEL_KINDS = frozenset({
    "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
})  # fmt: skip
DEMO_NAMESPACE = "posttrain-demo"


@dataclass
class StackState:
    emulator_url: str
    gateway_url: str
    broker_url: str
    orchestrator_token: str
    kubeconfig: str
    data_dir: str
    pids: dict[str, int]


def _state_path() -> Path:
    return run_root() / "stack.json"


def load() -> StackState | None:
    path = _state_path()
    return StackState(**json.loads(path.read_text())) if path.exists() else None


def _data_dir() -> Path:
    """This stack's own: keyed by its run directory, so two stacks never share (or wipe) one.

    Job trees must be reachable by the launcher's uid 10000, so not under a private home directory.
    """
    key = hashlib.sha256(str(run_root().resolve()).encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"posttrain-devstack-{os.getuid()}-{key}"
    path.mkdir(mode=0o700, exist_ok=True)
    # The name is predictable and the temporary directory shared: use only a real directory of ours.
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise cluster.ClusterError(f"{path} exists and is not a directory of uid {os.getuid()}; remove it")
    path.chmod(0o711)
    return path


def _emulator_token() -> tuple[str, Path]:
    """A fresh token per stack, in a 0600 file: on no command line and in no log."""
    token = f"hf_{secrets.token_urlsafe(24)}"
    path = run_root() / "hf-emulator.token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token, path


def emulator_argv(port: int, data_dir: Path, token_file: Path, assets: list[LocalRepo]) -> list[str]:
    """The emulator's command line: its token is named by file, never given (/proc shows argv)."""
    repos = [f"--repo={a.ref.kind}:{a.ref.repo_id}@{a.ref.revision}={a.path}" for a in assets]
    return [
        sys.executable, "-m", "devstack.hf_emulator", f"--port={port}", f"--data-dir={data_dir / 'hf'}",
        f"--token-file={token_file}", f"--namespace={HF_NAMESPACE}", *repos,
    ]  # fmt: skip


def _spawn(name: str, argv: list[str], env: dict[str, str], logs: Path) -> int:
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=REPO,
        )  # fmt: skip
    return proc.pid


def _wait_http(url: str, name: str, pid: int, log_file: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not cluster.is_alive(pid):
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-20:])
            raise cluster.ClusterError(f"{name} exited during start-up. Last log lines:\n{tail}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2):
            return
        time.sleep(0.3)
    raise cluster.ClusterError(f"{name} did not answer {url} within {timeout:.0f}s")


def _kubectl(state: cluster.ClusterState, *args: str, input: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(
        [str(state.kubectl()), f"--kubeconfig={state.kubeconfig}", *args],
        capture_output=True, text=True, input=input, timeout=60,
    )  # fmt: skip
    if check and proc.returncode != 0:
        raise cluster.ClusterError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def up() -> StackState:
    """The whole stack, or the one already running: the cluster, then the HF Jobs emulator, the
    operator and the gateway, each started once the one before answers."""
    existing = load()
    if existing and all(cluster.is_alive(p) for p in existing.pids.values()):
        log(f"the stack is already running; gateway at {existing.gateway_url}")
        return existing
    if existing:
        log("cleaning up a stack that is partly down")
        down(keep_cluster=True)

    from graders.assets import materialize_assets

    kube = cluster.up()
    _kubectl(kube, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    for ns in (SYSTEM_NAMESPACE, DEMO_NAMESPACE):
        _kubectl(kube, "create", "namespace", ns, check=False)
    # The namespace the local operator watches is the kubeconfig's default, so the README's plain
    # `kubectl apply -f examples/...` lands where it is reconciled.
    _kubectl(kube, "config", "set-context", "--current", f"--namespace={DEMO_NAMESPACE}")
    task_policy = _install_chart_cluster_objects(kube)
    log("building or reusing the task assets (tiny model, datasets)")
    assets = materialize_assets(progress=lambda message: log(message))

    data_dir = _data_dir()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "GATEWAY_", "HF_"))}
    base_env.update(KUBECONFIG=str(kube.kubeconfig), HF_HUB_DISABLE_TELEMETRY="1")
    pids: dict[str, int] = {}
    try:
        emulator_url, hf_token = _start_emulator(pids, base_env, data_dir, assets)
        broker_url = _start_operator(pids, base_env, kube, emulator_url, hf_token, task_policy)
        gateway_url, orchestrator_token = _start_gateway(pids, base_env, kube, broker_url)
    except BaseException:
        cluster.stop_pids(list(pids.values()))
        raise
    state = StackState(
        emulator_url=emulator_url,
        gateway_url=gateway_url,
        broker_url=broker_url,
        orchestrator_token=orchestrator_token,
        kubeconfig=str(kube.kubeconfig),
        data_dir=str(data_dir),
        pids=pids,
    )
    _state_path().write_text(json.dumps(asdict(state), indent=2))
    _state_path().chmod(0o600)
    return state


def chart_cluster_objects() -> list[dict[str, Any]]:
    """The chart rendered as `make up`'s release: the operator watching the demo namespace, where the
    gateway creates Episodes; only the cluster-level kinds, and no hooks."""
    proc = subprocess.run(
        [str(bin_dir() / "helm"), "template", RELEASE, str(CHART), f"--namespace={SYSTEM_NAMESPACE}",
         f"--kube-version={KUBERNETES_VERSION}", f"--set=operator.watchNamespaces={{{DEMO_NAMESPACE}}}",
         f"--set=gateway.episodeNamespace={DEMO_NAMESPACE}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if proc.returncode != 0:
        raise cluster.ClusterError(f"helm template: {proc.stderr.strip()}")
    return [
        d for d in yaml.safe_load_all(proc.stdout)
        if d and d["kind"] in CLUSTER_LEVEL_KINDS
        and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})
    ]  # fmt: skip


def _install_chart_cluster_objects(kube: cluster.ClusterState) -> str:
    """Installs them; returns the name of the task admission policy, into which the operator writes
    its registered tasks as the chart's would."""
    objects = chart_cluster_objects()
    _kubectl(
        kube, "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(objects)
    )
    policies = [d for d in objects if d["kind"] == "ValidatingAdmissionPolicy"]
    name: str = next(d["metadata"]["name"] for d in policies if d["spec"].get("variables"))
    return name


def _start_emulator(
    pids: dict[str, int], base_env: dict[str, str], data_dir: Path, assets: list[LocalRepo]
) -> tuple[str, str]:
    """(its URL, its API token), its bucket made."""
    logs = run_root() / "stack-logs"
    hf_token, hf_token_file = _emulator_token()
    emulator_port = cluster.free_port()
    pids["hf-emulator"] = _spawn(
        "hf-emulator", emulator_argv(emulator_port, data_dir, hf_token_file, assets), base_env, logs
    )
    emulator_url = f"http://127.0.0.1:{emulator_port}"
    _wait_http(
        f"{emulator_url}/_emulator/health",
        "the HF Jobs emulator",
        pids["hf-emulator"],
        logs / "hf-emulator.log",
    )
    request = urllib.request.Request(
        f"{emulator_url}/_emulator/buckets", data=json.dumps({"id": BUCKET}).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {hf_token}"},
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=10).close()
    return emulator_url, hf_token


def _start_operator(
    pids: dict[str, int],
    base_env: dict[str, str],
    kube: cluster.ClusterState,
    emulator_url: str,
    hf_token: str,
    task_policy: str,
) -> str:
    """Its broker's URL. It runs as the chart's operator ServiceAccount, with the chart's RBAC."""
    logs = run_root() / "stack-logs"
    sa_kubeconfig = cluster.mint_service_account_kubeconfig(
        kube, SYSTEM_NAMESPACE, OPERATOR_SA, run_root() / "operator-sa.kubeconfig", duration="24h"
    )
    broker_port = cluster.free_port()
    gateway_user = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{GATEWAY_SA}"
    env = operator_env(
        base_env,
        kubeconfig=sa_kubeconfig,
        hf_endpoint=emulator_url,
        hf_token=hf_token,
        hf_namespace=HF_NAMESPACE,
        hf_bucket=BUCKET,
        broker_port=broker_port,
        metrics_port=cluster.free_port(avoid={broker_port}),
        broker_allowed_users=[gateway_user],
        POSTTRAIN_POLL_INTERVAL_SECONDS="2",
        POSTTRAIN_EPISODE_TICK_SECONDS="1",
        POSTTRAIN_TASK_POLICY_NAME=task_policy,
    )
    pids["operator"] = _spawn(
        "operator",
        # Scoped to the demo namespace, so a shared cluster's other namespaces are left alone.
        [sys.executable, "-m", "kopf", "run", "--standalone", f"--namespace={DEMO_NAMESPACE}",
         "-m", "posttrain_operator.handlers"],
        env, logs,
    )  # fmt: skip
    broker_url = f"http://127.0.0.1:{broker_port}"
    _wait_http(f"{broker_url}/healthz", "the operator", pids["operator"], logs / "operator.log")
    return broker_url


def _start_gateway(
    pids: dict[str, int], base_env: dict[str, str], kube: cluster.ClusterState, broker_url: str
) -> tuple[str, str]:
    """(its URL, the orchestrator token); it reaches the broker as its ServiceAccount."""
    logs = run_root() / "stack-logs"
    sa_kubeconfig = cluster.mint_service_account_kubeconfig(
        kube, SYSTEM_NAMESPACE, GATEWAY_SA, run_root() / "gateway-sa.kubeconfig", duration="24h"
    )
    token_file = run_root() / "gateway-sa.token"
    token_file.write_text(yaml.safe_load(sa_kubeconfig.read_text())["users"][0]["user"]["token"])
    token_file.chmod(0o600)
    orchestrator_token = secrets.token_urlsafe(24)
    gateway_port = cluster.free_port()
    gateway_env = dict(
        base_env,
        KUBECONFIG=str(sa_kubeconfig),  # the chart's gateway identity: its Role in the demo namespace
        GATEWAY_NAMESPACE=DEMO_NAMESPACE,
        GATEWAY_ORCHESTRATOR_TOKEN=orchestrator_token,
        GATEWAY_BROKER_URL=broker_url,
        GATEWAY_BROKER_TOKEN_FILE=str(token_file),
    )
    pids["gateway"] = _spawn(
        "gateway",
        [sys.executable, "-m", "uvicorn", "env_gateway.main:app_from_env", "--factory", "--host=127.0.0.1",
         f"--port={gateway_port}", "--ws=websockets-sansio", "--log-level=warning"],
        gateway_env, logs,
    )  # fmt: skip
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    _wait_http(f"{gateway_url}/health", "the gateway", pids["gateway"], logs / "gateway.log")
    return gateway_url, orchestrator_token


def new_episode(state: StackState, task: str = "t0_artifact") -> tuple[str, str]:
    """An Episode created the kubectl way, with an agent token whose hash only is stored."""
    kube = cluster.load_state()
    assert kube is not None
    token = secrets.token_urlsafe(32)
    name = f"{task.replace('_', '-')}-{secrets.token_hex(3)}"
    manifest: dict[str, Any] = {
        "apiVersion": "posttrain.dev/v1alpha1",
        "kind": "Episode",
        "metadata": {"name": name, "namespace": DEMO_NAMESPACE},
        "spec": {
            "task": task,
            "budgetUSD": "0.25",
            "backend": "hf-jobs",
            "agentTokenHash": hashlib.sha256(token.encode()).hexdigest(),
        },
    }
    _kubectl(kube, "apply", "-f", "-", input=json.dumps(manifest))
    return name, token


def down(keep_cluster: bool = False) -> None:
    state = load()
    if state is not None:
        cluster.stop_pids(list(state.pids.values()))
        with contextlib.suppress(FileNotFoundError):
            _state_path().unlink()
        remove_tree(Path(state.data_dir))
    for leftover in (
        "gateway-sa.kubeconfig",
        "operator-sa.kubeconfig",
        "gateway-sa.token",
        "hf-emulator.token",
    ):
        (run_root() / leftover).unlink(missing_ok=True)
    if not keep_cluster:
        cluster.down()


def describe(state: StackState) -> str:
    return "\n".join(
        [
            f"export KUBECONFIG={state.kubeconfig} PATH={bin_dir()}:$PATH"
            f"   # kubectl, helm; namespace {DEMO_NAMESPACE}",
            f"gateway            {state.gateway_url}   (MCP at {state.gateway_url}/mcp, OpenEnv /ws)",
            f"orchestrator token {state.orchestrator_token}",
            f"HF Jobs emulator   {state.emulator_url}",
            f"logs               {run_root() / 'stack-logs'}",
        ]
    )
