"""The pods backend on the kind cluster: episodes whose training, `dev_evaluate` and score jobs run as
hardened pods of the launcher image in the episode's own namespace, with the hostPath artifact store
the chart configures, spend settled from the pods' run time at the flavor's price."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import sys
from typing import Any

import pytest
from posttrain_operator.api.rules import parse_time
from posttrain_operator.ledger import billed_seconds, cost_for, reservation_for

from devstack.kind import seccomp
from graders.tasks import get_task
from tests.checkpoint_jobs import BIG_CHECKPOINT, RESUMED
from tests.e2e.support import (
    GATEWAY_SERVICE,
    HOLD_LABEL,
    JOB_RUNTIMES,
    POD_FLAVORS,
    PROBE_DEPENDENCY,
    PROBE_DEPENDENCY_VERSION,
    PROBE_PACKAGE,
    PROBE_VERSION,
    REPO,
    Canary,
    Release,
    port_forward,
    run_probe_pod,
    say,
    use_job_runtime,
)
from tests.e2e.test_chart_in_cluster import _connect_script
from tests.gsm8k_standin import standin_registry
from tests.helpers import wait_for
from tests.package_index import PackageIndex

sys.path.insert(0, str(REPO / "examples"))
import scripted_sft_agent

pytestmark = pytest.mark.timeout(2400)

PRICE = int(POD_FLAVORS["cpu-basic"]["priceMicroUSDPerMinute"])


@pytest.fixture(scope="module", params=JOB_RUNTIMES)
def pods_release(request: pytest.FixtureRequest, release: Release) -> Release:
    """The release with its flavors on one job runtime: a test here runs under runc, then gVisor, unless
    it names one below."""
    if not release.cluster.is_kind:
        pytest.skip("the pods backend is enabled on the kind cluster only (its store is a hostPath)")
    use_job_runtime(release, request.param)
    return release


# The workloads (training, a 5 GiB checkpoint, whole episodes with their grading) run once, under gVisor:
# the integration tier runs them on this machine's kernel, which is all runc adds, and gVisor's system
# call surface is what they need to be shown to work on. Isolation and limits run under both runtimes.
on_gvisor_only = pytest.mark.parametrize("pods_release", ["gvisor"], indirect=True)
on_runc_only = pytest.mark.parametrize("pods_release", ["runc"], indirect=True)


def _play(request: pytest.FixtureRequest, release: Release, task: str) -> scripted_sft_agent.EpisodeResult:
    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        result = asyncio.run(
            scripted_sft_agent.run_episode(
                gateway, release.orchestrator_token, task, say=lambda _: None, backend="pods"
            )
        )
    say(
        request.config,
        f"\n[pods] {result.task:22} {result.outcome:8} reward {result.reward or 'null':>6} "
        f"dev {result.dev_score or '-':>5} spend ${result.spend_usd} wall {result.wall_seconds}s",
    )
    return result


GVISOR_KERNEL = "4.19.0-gvisor"  # what gVisor's kernel reports as its release


def _assert_ran_on_its_runtime(release: Release, status: dict[str, Any]) -> None:
    """The job's pod had the pass's RuntimeClass, and its launcher saw that runtime's kernel."""
    runtime = status["runtime"]
    if release.job_runtime == "gvisor":
        assert runtime["runtimeClass"] == "gvisor" and runtime["kernel"].startswith(GVISOR_KERNEL), runtime
    else:
        node = release.cluster.json("get", "nodes")["items"][0]["status"]["nodeInfo"]["kernelVersion"]
        assert runtime["runtimeClass"] == "" and runtime["kernel"].startswith(node), (runtime, node)


def _assert_settled_from_pod_run_time(release: Release, episode: str) -> dict[str, Any]:
    """Every job ran as a pod of the episode's namespace; the Episode paid, for each agent job, its
    container's run time (started to finished, per started minute) at the flavor's price."""
    status: dict[str, Any] = release.json("get", "episode", episode)["status"]
    ledger = status["ledger"]
    assert ledger["reservedMicroUSD"] == 0, ledger
    jobs = [j for j in release.json("get", "agentjobs")["items"] if j["spec"]["episode"] == episode]
    assert {j["spec"]["purpose"] for j in jobs} == {"train", "devEval", "score"}, jobs
    expected = 0
    for job in jobs:
        st = job["status"]
        assert st["phase"] == "Succeeded", st
        assert st["backend"] == "pods" and "/" in st["backendJobId"], st
        seconds = billed_seconds(parse_time(st["startedAt"]), parse_time(st["finishedAt"]))
        assert st["billedSeconds"] == seconds > 0, st
        _assert_ran_on_its_runtime(release, st)
        if job["spec"]["purpose"] != "score":
            expected += cost_for(int(POD_FLAVORS[job["spec"]["flavor"]]["priceMicroUSDPerMinute"]), seconds)
    assert ledger["settledMicroUSD"] == expected, (ledger, [j["status"] for j in jobs])
    return status


def test_t0_artifact_on_pods(request: pytest.FixtureRequest, pods_release: Release) -> None:
    result = _play(request, pods_release, "t0_artifact")
    assert (result.outcome, result.reward) == ("Scored", "1"), result
    status = _assert_settled_from_pod_run_time(pods_release, result.episode)
    assert status["phase"] == "Completed" and status["reward"] == "1"
    assert status["egress"] == {"verified": 3, "open": 0}, status
    # Every job gone: the episode's namespace is deleted, and the Episode says so once it is.
    jobs = [
        j for j in pods_release.json("get", "agentjobs")["items"] if j["spec"]["episode"] == result.episode
    ]
    namespace = jobs[0]["status"]["backendJobId"].split("/")[0]
    wait_for(
        lambda: pods_release.json("get", "episode", result.episode)["status"].get("backendReleased"),
        timeout=300,
        interval=1,
        what="the episode's backend resources released",
    )
    assert not pods_release.cluster.kubectl("get", "namespace", namespace, "--ignore-not-found").strip()


# --- egress: verified from inside the pod, failing closed ---------------------------------------

HOSTILE = r"""
import ctypes, errno, json, os, socket, struct
targets = json.loads(@@TARGETS@@)
found = {}
def attempt(name, fn):
    try:
        found[name] = "open: " + repr(fn())
    except OSError as exc:
        found[name] = "refused: " + (errno.errorcode.get(exc.errno or 0) or type(exc).__name__)
    except Exception as exc:
        found[name] = "refused: " + type(exc).__name__
def sendto(host, port):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return sock.sendto(b"escape", (host, port))
for family, kind, proto, label in ((socket.AF_INET, socket.SOCK_STREAM, 0, "inet-stream"),
                                   (socket.AF_INET, socket.SOCK_DGRAM, 0, "inet-dgram"),
                                   (socket.AF_INET6, socket.SOCK_STREAM, 0, "inet6-stream"),
                                   (socket.AF_NETLINK, socket.SOCK_RAW, 0, "netlink-route"),
                                   (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW, "inet-raw"),
                                   (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP, "icmp"),
                                   (socket.AF_INET6, socket.SOCK_DGRAM, 58, "icmpv6"),
                                   (socket.AF_PACKET, socket.SOCK_RAW, 0, "packet-raw"),
                                   (socket.AF_VSOCK, socket.SOCK_STREAM, 0, "vsock"),
                                   (socket.AF_NETLINK, socket.SOCK_RAW, 9, "netlink-audit")):
    attempt("socket " + label, lambda: socket.socket(family, kind, proto).close())
for name in ("kubernetes.default.svc.cluster.local", "kubernetes", "example.com"):
    attempt("lookup " + name, lambda: socket.getaddrinfo(name, 443))
for name, host, port in targets:
    attempt(f"connect {name} {host}:{port}", lambda: socket.create_connection((host, port), 3).close())
    attempt(f"udp {name} {host}:{port}", lambda: sendto(host, port))
libc = ctypes.CDLL(None, use_errno=True)
def syscall(number, *args):
    if libc.syscall(number, *args) == -1:
        raise OSError(ctypes.get_errno(), "syscall")
attempt("unshare user+net", lambda: syscall(272, 0x10000000 | 0x40000000))
attempt("io_uring_setup", lambda: syscall(425, 8, ctypes.create_string_buffer(120)))
def netlink_route_write():  # RTM_NEWADDR: an address of the pod's network on lo
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
        ifaddr = struct.pack("BBBBI", socket.AF_INET, 24, 0, 0, socket.if_nametoindex("lo"))
        attr = struct.pack("HH4s", 8, 2, socket.inet_aton("10.244.0.99"))
        sock.send(struct.pack("IHHII", 16 + len(ifaddr) + len(attr), 20, 0x405, 1, 0) + ifaddr + attr)
        code = struct.unpack_from("i", sock.recv(4096), 16)[0]
        if code:
            raise OSError(-code, "RTM_NEWADDR")
attempt("netlink route write", netlink_route_write)
found["interfaces"] = sorted(name for _, name in socket.if_nameindex())
found["kernel"] = " ".join(os.uname()[2:4])
def dmesg():  # syslog(SYSLOG_ACTION_READ_ALL): the kernel's log, where the runtime lets a job read it
    buffer = ctypes.create_string_buffer(1 << 16)
    size = libc.klogctl(3, buffer, len(buffer))
    if size < 0:
        raise OSError(ctypes.get_errno(), "klogctl")
    return buffer.raw[:size].decode(errors="replace").splitlines()[:2]
attempt("dmesg", dmesg)
with open(os.path.join(os.environ["POSTTRAIN_OUTPUT_DIR"], "result.json"), "w") as fh:
    json.dump(found, fh)
"""
# What a loopback job may open: sockets (their connects off lo fail), and route netlink (getifaddrs).
LOOPBACK_SOCKETS = {"socket inet-stream", "socket inet-dgram", "socket inet6-stream", "socket netlink-route"}


def _cluster_targets(release: Release, canary: Canary) -> list[tuple[str, str, int]]:
    """Every address a job must not reach, as this cluster has them."""
    api = release.cluster.json(
        "-n", "default", "get", "endpointslices", "-l", "kubernetes.io/service-name=kubernetes"
    )
    endpoint = api["items"][0]
    api_ip, api_port = endpoint["endpoints"][0]["addresses"][0], endpoint["ports"][0]["port"]
    service_ip = release.cluster.json("-n", "default", "get", "service", "kubernetes")["spec"]["clusterIP"]
    dns_ip = release.cluster.json("-n", "kube-system", "get", "service", "kube-dns")["spec"]["clusterIP"]
    gateway = release.json("get", "service", GATEWAY_SERVICE)["spec"]["clusterIP"]
    operator = release.ready_pod("operator")
    node_ip = operator["status"]["hostIP"]
    return [
        ("kubernetes-api-service", service_ip, 443),
        ("kubernetes-api-endpoint", api_ip, int(api_port)),
        ("cluster-dns", dns_ip, 53),
        ("gateway", gateway, 80),
        ("operator-broker", operator["status"]["podIP"], 8081),
        ("node-kubelet", node_ip, 10250),
        ("canary", canary.host, canary.port),
    ]


async def _submit(
    gateway: str, release: Release, script: str, flavor: str, *package_lists: list[str]
) -> tuple[str, list[str], Any]:
    """A new pods episode and one job of `script` per package list (one job when none is given)."""
    observation = await scripted_sft_agent.reset_episode(
        gateway, release.orchestrator_token, "t0_artifact", "pods", flavors=["cpu-basic", "held"]
    )
    token, episode = observation["metadata"]["agent_token"], observation["episode"]
    jobs = []
    async with scripted_sft_agent.agent_client(gateway, token) as session:
        for packages in package_lists or ([],):
            submitted = await scripted_sft_agent.call_tool(
                session, "jobs_submit", script=script, timeout_seconds=300, flavor=flavor, packages=packages
            )
            jobs.append(submitted["job"]["name"])
    return episode, jobs, token


def _job_pod(release: Release, job: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        job_id = release.json("get", "agentjob", job)["status"].get("backendJobId")
        if not job_id:
            return None
        namespace, name = job_id.split("/")
        pod: dict[str, Any] = release.cluster.json("-n", namespace, "get", "pod", name)
        return pod

    pod: dict[str, Any] = wait_for(found, timeout=300, interval=1, what=f"the pod of {job}")
    return pod


def _egress_report(pod: dict[str, Any]) -> dict[str, Any]:
    """The launcher's egress report, which it leaves as the job container's termination message."""
    for container in pod["status"]["containerStatuses"]:
        message = ((container.get("state") or {}).get("terminated") or {}).get("message")
        if message:
            report: dict[str, Any] = json.loads(message)
            return report
    raise AssertionError(f"no termination message in {pod['status']['containerStatuses']}")


def _finished(release: Release, job: str, timeout: float = 600) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        status: dict[str, Any] = release.json("get", "agentjob", job)["status"]
        return status if status.get("phase") in ("Succeeded", "Failed", "Cancelled") else None

    status: dict[str, Any] = wait_for(done, timeout=timeout, interval=1, what=f"{job} to finish")
    return status


def test_a_hostile_job_is_refused_everywhere(
    request: pytest.FixtureRequest, pods_release: Release, canary: Canary
) -> None:
    release = pods_release
    targets = _cluster_targets(release, canary)
    # Control: from a pod without the episode's policy, the canary and the API answer.
    phase, logs = run_probe_pod(release, _connect_script(canary.host, canary.port))
    assert phase == "Succeeded" and logs.strip() == "connected", logs
    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        # Another episode's job pod, running its code while the hostile job probes it.
        sleeper = "import time\nprint('sleeping', flush=True)\ntime.sleep(280)\n"
        _, (neighbour,), _ = asyncio.run(_submit(gateway, release, sleeper, "cpu-basic"))
        try:
            pod = _job_pod(release, neighbour)
            wait_for(
                lambda: "sleeping"
                in release.cluster.kubectl(
                    "-n", pod["metadata"]["namespace"], "logs", pod["metadata"]["name"], check=False
                ),
                timeout=300,
                interval=1,
                what="another episode's job to run (its own egress check, which probes the canary, done)",
            )
            # Counted from here: the hostile job's launcher rounds may reach the canary, its code may not.
            accepted_before = canary.accepted
            targets.append(("another-episodes-pod", _job_pod(release, neighbour)["status"]["podIP"], 8080))
            script = HOSTILE.replace("@@TARGETS@@", repr(json.dumps(targets)))
            episode, (job,), _ = asyncio.run(_submit(gateway, release, script, "cpu-basic"))
            status = _finished(release, job)
        finally:
            release.kubectl("delete", "agentjob", neighbour, "--wait=false")
    assert status["phase"] == "Succeeded", status
    assert status["network"] == "loopback", status
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["EgressVerified"]["status"] == "True", conditions
    assert conditions["EgressVerified"]["reason"] == "ProbesClosed"
    assert conditions["EgressVerified"]["message"].endswith("; job network loopback")
    assert _egress_report(_job_pod(release, job))["network"] == {"mode": "loopback", "namespace": "launcher"}
    result_file = release.cluster.store_dir / "outputs" / release.namespace / episode / job / "result.json"  # type: ignore[operator]
    found = json.loads(result_file.read_text())
    say(
        request.config, "\n[pods] hostile job:\n" + "\n".join(f"  {k}: {v}" for k, v in sorted(found.items()))
    )
    assert found.pop("interfaces") == ["lo"]
    # `uname` and `dmesg` inside the job: the node's kernel under runc; gVisor's own under runsc.
    kernel, dmesg = found.pop("kernel"), found.pop("dmesg")
    _assert_ran_on_its_runtime(release, status)
    assert kernel == status["runtime"]["kernel"]
    if release.job_runtime == "gvisor":
        assert dmesg.startswith("open") and "Starting gVisor" in dmesg, dmesg
    else:
        assert dmesg == "refused: EPERM", dmesg  # the host kernel's log is not the job's to read
    assert len(found) == 10 + 3 + 2 * len(targets) + 3
    assert {k for k, v in found.items() if v.startswith("open")} == LOOPBACK_SOCKETS, found
    for name, outcome in found.items():
        if name.startswith(("connect", "udp")):  # no route: the job's namespace holds lo alone
            assert outcome in ("refused: ENETUNREACH", "refused: EHOSTUNREACH"), (name, outcome)
        elif name.startswith("socket") and name not in LOOPBACK_SOCKETS:
            assert outcome == "refused: EACCES", (name, outcome)  # the launcher's filter
    assert found["unshare user+net"] == found["io_uring_setup"] == "refused: EACCES"
    assert found["netlink route write"] == "refused: EPERM"  # no capability in its own namespace
    # The hostile job's own connects to the canary never arrived. The launcher's probe rounds before
    # its last may have, while the policy was not yet programmed (that is what its rounds are for):
    # how many rounds it took, its report in the pod's termination message says.
    rounds = _egress_report(_job_pod(release, job))["rounds"]
    assert canary.accepted <= accepted_before + rounds - 1, (canary.accepted, accepted_before, rounds)
    counts = release.json("get", "episode", episode)["status"]["egress"]
    assert counts == {"verified": 1, "open": 0}, counts


def test_torchrun_and_a_localhost_server_run_in_a_job_pod(pods_release: Release) -> None:
    """Loopback on pods: the launcher's own user and network namespace carries torchrun's TCPStore,
    a gloo all-reduce over two processes, and an HTTP server with its client; getifaddrs sees lo."""
    release = pods_release
    script = (REPO / "tests" / "integration" / "launcher" / "jobs" / "loopback_stack.py").read_text()
    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        episode, (job,), _ = asyncio.run(_submit(gateway, release, script, "cpu-basic"))
    status = _finished(release, job)
    outputs = release.cluster.store_dir / "outputs" / release.namespace / episode / job  # type: ignore[operator]
    assert status["phase"] == "Succeeded", (status, (outputs / "posttrain-job.log").read_text()[-4000:])
    result = json.loads((outputs / "result.json").read_text())
    assert result["torchrun"] == 0 and result["sum"] == ["all-reduce sum 3.0"], result
    assert result["http"] == "hello from localhost"
    assert result["getifaddrs"] == ["lo"]
    assert result["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    _assert_hardened(_job_pod(release, job))


def test_a_missing_policy_fails_the_job_closed_before_any_job_code(pods_release: Release) -> None:
    """The test removes the namespace's policy while the job's pod waits for a node: the launcher
    finds the network open, and the job fails with the documented reason, its code never run."""
    release = pods_release
    script = "import os\nopen(os.environ['POSTTRAIN_OUTPUT_DIR'] + '/ran', 'w').write('yes')\n"
    node = release.cluster.json("get", "nodes")["items"][0]["metadata"]["name"]
    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        episode, (job,), _ = asyncio.run(_submit(gateway, release, script, "held"))
    pod = _job_pod(release, job)
    namespace = pod["metadata"]["namespace"]
    try:
        _assert_hardened(pod)
        release.cluster.kubectl("-n", namespace, "delete", "networkpolicy", "--all")
        release.cluster.kubectl("label", "node", node, f"{HOLD_LABEL}=released", "--overwrite")
        status = _finished(release, job)
    finally:
        release.cluster.kubectl("label", "node", node, f"{HOLD_LABEL}-", check=False)
    assert status["phase"] == "Failed", status
    assert status.get("exitCode") == 4, status
    assert "egress open to " in status["message"] and "no job code ran" in status["message"], status
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["EgressVerified"]["status"], conditions["EgressVerified"]["reason"]) == (
        "False",
        "EgressOpen",
    )
    outputs = release.cluster.store_dir / "outputs" / release.namespace / episode / job  # type: ignore[operator]
    assert not (outputs / "ran").exists()
    episode_status = release.json("get", "episode", episode)["status"]
    assert episode_status["egress"] == {"verified": 0, "open": 1}, episode_status


@on_runc_only  # the flavor names its own RuntimeClass in either pass
def test_a_flavor_whose_runtime_the_node_lacks_fails_its_job_unbilled_and_the_episode_goes_on(
    pods_release: Release,
) -> None:
    """`cpu-absent-runtime` names a RuntimeClass whose handler no node has: the kubelet retries its
    sandbox for ever and says why only in an event. The job fails with those words, charged nothing,
    its pod removed; the next job of the same Episode runs."""
    release = pods_release
    script = "import os\nopen(os.environ['POSTTRAIN_OUTPUT_DIR'] + '/ran', 'w').write('yes')\n"
    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:

        async def play() -> tuple[str, str, str]:
            observation = await scripted_sft_agent.reset_episode(
                gateway,
                release.orchestrator_token,
                "t0_artifact",
                "pods",
                flavors=["cpu-basic", "cpu-absent-runtime"],
            )
            token, episode = observation["metadata"]["agent_token"], observation["episode"]
            async with scripted_sft_agent.agent_client(gateway, token) as session:
                call = functools.partial(scripted_sft_agent.call_tool, session, "jobs_submit", script=script)
                stuck = (await call(timeout_seconds=300, flavor="cpu-absent-runtime"))["job"]["name"]
                await asyncio.to_thread(_finished, release, stuck)
                after = (await call(timeout_seconds=300, flavor="cpu-basic"))["job"]["name"]
            return episode, stuck, after

        episode, stuck, after = asyncio.run(play())
    status = _finished(release, stuck)
    assert (status["phase"], status["backendStage"]) == ("Failed", "Failed/RuntimeHandlerMissing"), status
    assert "has no runtime for the pod's RuntimeClass 'absent'" in status["message"], status["message"]
    assert 'no runtime for "absent" is configured' in status["message"]  # the kubelet's own words
    assert (status["billedSeconds"], status["settledMicroUSD"]) == (0, 0), status
    assert status["runtime"] == {"runtimeClass": "absent"}, status
    namespace, pod = status["backendJobId"].split("/")
    wait_for(
        lambda: not release.cluster.kubectl("-n", namespace, "get", "pod", pod, "--ignore-not-found").strip(),
        timeout=120, interval=1, what=f"the stuck pod {pod} deleted",
    )  # fmt: skip
    assert _finished(release, after)["phase"] == "Succeeded"
    assert release.json("get", "episode", episode)["status"]["phase"] == "Running"


def test_packages_are_staged_by_the_operator_and_installed_with_no_egress(
    request: pytest.FixtureRequest, pods_release: Release, package_index: PackageIndex
) -> None:
    """The pod has no egress: the operator resolved the package with its dependency (not numpy, which
    the image holds) from its index onto the store, the pod installed both from its read-only mount
    after the egress check passed, and the job's status pins each wheel by sha256; a package the
    index does not have fails its job at submission, before any pod exists."""
    release = pods_release
    script = (
        "import os, ptprobe\nopen(os.environ['POSTTRAIN_OUTPUT_DIR'] + '/value', 'w').write(ptprobe.VALUE)\n"
    )
    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        episode, (job, missing), _ = asyncio.run(
            _submit(
                gateway, release, script, "cpu-basic", [f"{PROBE_PACKAGE}=={PROBE_VERSION}"], ["nosuchpkg"]
            )
        )
    status = _finished(release, job)
    assert status["phase"] == "Succeeded", status
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["EgressVerified"]["status"] == "True", conditions
    store = release.cluster.store_dir
    assert store is not None
    value = store / "outputs" / release.namespace / episode / job / "value"
    assert value.read_text() == "staged by the operator"
    wheel = f"{PROBE_PACKAGE}-{PROBE_VERSION}-py3-none-any.whl"
    assert package_index.served[f"/files/{wheel}"] >= 1, package_index.served
    namespace, pod = status["backendJobId"].split("/")
    staged = store / "wheels" / namespace / pod / wheel
    assert staged.is_file() and not staged.stat().st_mode & 0o222
    dependency = f"{PROBE_DEPENDENCY}-{PROBE_DEPENDENCY_VERSION}-py3-none-any.whl"
    digests = {n: hashlib.sha256((store / "wheels" / namespace / pod / n).read_bytes()).hexdigest()
               for n in (wheel, dependency)}  # fmt: skip
    assert status["packages"] == [
        {"name": PROBE_PACKAGE, "version": PROBE_VERSION, "sha256": digests[wheel]},
        {"name": PROBE_DEPENDENCY, "version": PROBE_DEPENDENCY_VERSION, "sha256": digests[dependency]},
    ]
    failed = _finished(release, missing)
    assert failed["phase"] == "Failed" and failed["reason"] == "SubmissionFailed", failed
    assert "nosuchpkg" in failed["message"] and "HTTP 404" in failed["message"], failed
    assert not failed.get("backendJobId"), failed
    say(request.config, f"\n[pods] packages: {job} installed {wheel}; {missing}: {failed['message'][:100]}")


# An agent job's pod: the nodes' loopback profile (the runtime's default rules and the launcher's unshare).
LOOPBACK_PROFILE = {"type": "Localhost", "localhostProfile": seccomp.PROFILE_NAME}


def _assert_hardened(pod: dict[str, Any]) -> None:
    """An agent job's pod as the API server admitted it (read back, not as the operator built it)."""
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["activeDeadlineSeconds"] == 300
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 10000
    assert spec["securityContext"]["seccompProfile"] == LOOPBACK_PROFILE
    assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"))
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["runAsUser"] == 10000 and security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == LOOPBACK_PROFILE
    # No service-account token was mounted by the admission plugin.
    assert not [m for m in container["volumeMounts"] if "serviceaccount" in m["mountPath"]]


# --- bounds: output cap, deadline, memory ---------------------------------------------------------

BOUNDED = {
    # 3 GiB of apparent size (sparse) in the job's own output dir: past the agent cap of 2 GiB, in
    # files of 1 GiB (RLIMIT_FSIZE refuses any single file past the cap).
    "output-cap": (
        "import os, time\n"
        "for i in range(3):\n"
        "    with open(os.environ['POSTTRAIN_OUTPUT_DIR'] + f'/big{i}', 'wb') as f:\n"
        "        f.truncate(1 << 30)\n"
        "time.sleep(600)\n",
        600,
    ),
    "deadline": ("import time\ntime.sleep(600)\n", 60),
    "memory": ("blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))\n", 600),
}


def test_output_cap_deadline_and_memory_stop_the_job_charged_only_what_it_used(
    request: pytest.FixtureRequest, pods_release: Release
) -> None:
    release = pods_release

    async def submit_all(gateway: str) -> tuple[str, dict[str, str]]:
        observation = await scripted_sft_agent.reset_episode(
            gateway, release.orchestrator_token, "t0_artifact", "pods", max_concurrent_jobs=3
        )
        token, episode = observation["metadata"]["agent_token"], observation["episode"]
        names = {}
        async with scripted_sft_agent.agent_client(gateway, token) as session:
            for label, (script, timeout) in BOUNDED.items():
                submitted = await scripted_sft_agent.call_tool(
                    session, "jobs_submit", script=script, timeout_seconds=timeout
                )
                names[label] = submitted["job"]["name"]
        return episode, names

    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        episode, names = asyncio.run(submit_all(gateway))
    statuses = {label: _finished(release, name) for label, name in names.items()}
    lines = [
        f"  {label:10} {s['phase']:8} {s.get('billedSeconds')}s  {s.get('message', '')[:110]}"
        for label, s in statuses.items()
    ]
    say(request.config, "\n[pods] bounded jobs:\n" + "\n".join(lines))
    for label, status in statuses.items():
        assert status["phase"] == "Failed", (label, status)
        # Charged for what ran (started to finished), not for the timeout it reserved; but never more
        # than that reservation: the deadline job can outlast its 60 s by a second, a minute more
        # that is booked as platform spend.
        seconds = billed_seconds(parse_time(status["startedAt"]), parse_time(status["finishedAt"]))
        charged = min(cost_for(PRICE, seconds), reservation_for(PRICE, BOUNDED[label][1]))
        assert status["billedSeconds"] == seconds and status["settledMicroUSD"] == charged, (label, status)
    assert statuses["output-cap"]["exitCode"] == 3, statuses["output-cap"]
    assert "max_output_bytes" in statuses["output-cap"]["message"]
    assert statuses["output-cap"]["billedSeconds"] < 120
    assert "DeadlineExceeded" in statuses["deadline"]["message"], statuses["deadline"]
    assert 55 <= statuses["deadline"]["billedSeconds"] < 120
    memory = statuses["memory"]
    assert "OOMKilled" in memory["message"] or "MemoryError" in "\n".join(_logs(release, names["memory"])), (
        memory
    )
    assert memory["billedSeconds"] < 120
    ledger = release.json("get", "episode", episode)["status"]["ledger"]
    assert ledger["settledMicroUSD"] == sum(s["settledMicroUSD"] for s in statuses.values())
    # Nothing of the capped job is left to publish; the others left only the launcher's files (the log
    # and the copy of the script).
    outputs = release.cluster.store_dir / "outputs" / release.namespace / episode  # type: ignore[operator]
    assert sorted(p.relative_to(outputs).as_posix() for p in outputs.rglob("*") if p.is_file()) == sorted(
        f"{names[label]}/{name}"
        for label in ("deadline", "memory")
        for name in ("posttrain-job.log", "posttrain-script.py")
    )
    assert statuses["output-cap"]["reason"] == "OutputCapExceeded"


def _logs(release: Release, job: str) -> list[str]:
    job_id = release.json("get", "agentjob", job)["status"]["backendJobId"]
    namespace, name = job_id.split("/")
    return release.cluster.kubectl("-n", namespace, "logs", name, check=False).splitlines()


# --- jobs that build on jobs; what a training job's data loading needs ----------------------------

DRAFT = """
import json, os
out = os.environ["POSTTRAIN_OUTPUT_DIR"]
json.dump({"draft": list(range(64))}, open(os.path.join(out, "draft.json"), "w"))
"""
FINISH = """
import json, os
import torch
from torch.utils.data import DataLoader, TensorDataset
source = os.environ["POSTTRAIN_INPUT_FROM_0"]
draft = json.load(open(os.path.join(source, "draft.json")))["draft"]
shm = os.statvfs("/dev/shm")
# Two workers hand their batches over /dev/shm.
data = TensorDataset(torch.tensor(draft, dtype=torch.float32).reshape(-1, 1).repeat(1, 4096))
total = sum(float(b[0].sum()) for b in DataLoader(data, batch_size=16, num_workers=2))
read_only = not os.access(source, os.W_OK)
result = {"shm_bytes": shm.f_blocks * shm.f_frsize, "total": total, "read_only": read_only}
json.dump(result, open(os.path.join(os.environ["POSTTRAIN_OUTPUT_DIR"], "result.json"), "w"))
print("finished", json.dumps(result))
"""


def test_a_job_reads_an_earlier_jobs_outputs_and_loads_data_with_workers_over_dev_shm(
    pods_release: Release,
) -> None:
    release = pods_release

    async def chain(gateway: str) -> tuple[str, str, dict[str, Any]]:
        observation = await scripted_sft_agent.reset_episode(
            gateway, release.orchestrator_token, "t0_artifact", "pods"
        )
        token = observation["metadata"]["agent_token"]
        async with scripted_sft_agent.agent_client(gateway, token) as session:
            first = await scripted_sft_agent.call_tool(
                session, "jobs_submit", script=DRAFT, timeout_seconds=300
            )
            first_name = first["job"]["name"]
            await asyncio.to_thread(_finished, release, first_name)
            second = await scripted_sft_agent.call_tool(
                session, "jobs_submit", script=FINISH, timeout_seconds=600, inputs_from=[first_name]
            )
            second_name = second["job"]["name"]
            await asyncio.to_thread(_finished, release, second_name)
            logs = await scripted_sft_agent.call_tool(session, "jobs_logs", job=second_name)
        return first_name, second_name, logs

    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        first, second, logs = asyncio.run(chain(gateway))
    status = release.json("get", "agentjob", second)["status"]
    assert status["phase"] == "Succeeded", (status, logs)
    assert status["lineage"] == [first]
    result = json.loads(logs["lines"][-1].removeprefix("finished "))
    if release.job_runtime == "gvisor":
        # The sandbox's own tmpfs: statvfs reports its size, not the volume's; what a job puts there
        # is the sandbox's memory, held by the pod's cgroup.
        assert result["shm_bytes"] > 768 << 20, result
    else:
        assert result["shm_bytes"] == 768 << 20  # the flavor's shmSize, not the runtime's 64 MiB
    assert result["total"] == sum(range(64)) * 4096 and result["read_only"]
    assert "posttrain-job.log" in {a["path"] for a in status["artifacts"]}


@on_gvisor_only
def test_a_train_job_in_the_trl_environment_runs_sft_trainer_on_the_tiny_model(
    pods_release: Release, environment_images: dict[str, str]
) -> None:
    release = pods_release
    script = (REPO / "tests" / "e2e" / "jobs" / "sft_trl.py").read_text()

    async def train(gateway: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
        observation = await scripted_sft_agent.reset_episode(
            gateway, release.orchestrator_token, "t0_arithmetic_format_trl", "pods"
        )
        token = observation["metadata"]["agent_token"]
        async with scripted_sft_agent.agent_client(gateway, token) as session:
            info = await scripted_sft_agent.call_tool(session, "task_info")
            submitted = await scripted_sft_agent.call_tool(
                session, "jobs_submit", script=script, timeout_seconds=600, datasets=["train"]
            )
            name = submitted["job"]["name"]
            await asyncio.to_thread(_finished, release, name)
            logs = await scripted_sft_agent.call_tool(session, "jobs_logs", job=name, tail=200)
        return info, name, logs

    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        info, job, logs = asyncio.run(train(gateway))
    assert info["agent_environment"] == "trl", info
    status = release.json("get", "agentjob", job)["status"]
    assert status["phase"] == "Succeeded", (status, logs["lines"][-20:])
    assert _job_pod(release, job)["spec"]["containers"][0]["image"] == environment_images["trl"]
    versions = next(line for line in logs["lines"] if line.startswith("versions "))
    assert versions.split()[1:] == ["1.16.0", "0.21.2", "5.2.0"], versions  # trl, peft, datasets as locked
    trained = json.loads(next(line for line in logs["lines"] if line.startswith("sft ")).removeprefix("sft "))
    assert trained["steps"] == 5, trained
    assert "model.safetensors" in {a["path"] for a in status["artifacts"]}


@on_gvisor_only
def test_a_5_gib_checkpoint_chains_into_a_graded_job_on_pods(pods_release: Release) -> None:
    """The emulator's checkpoint chain (tests/integration/operator/test_full_episode.py) on pods: the
    first job's 5 GiB on the store, read by the second through inputsFrom, the second graded on the
    task's grader flavor; every job settled at its pod's run time."""
    release = pods_release

    async def chain(gateway: str) -> tuple[str, str, str, dict[str, Any]]:
        observation = await scripted_sft_agent.reset_episode(
            gateway, release.orchestrator_token, "t0_arithmetic_format_trl", "pods"
        )
        token, episode = observation["metadata"]["agent_token"], observation["episode"]
        async with scripted_sft_agent.agent_client(gateway, token) as session:
            call = functools.partial(scripted_sft_agent.call_tool, session)
            first = (await call("jobs_submit", script=BIG_CHECKPOINT, timeout_seconds=1500))["job"]["name"]
            await asyncio.to_thread(_finished, release, first, 1500)
            submitted = await call("jobs_submit", script=RESUMED, timeout_seconds=900, inputs_from=[first])
            second = submitted["job"]["name"]
            await asyncio.to_thread(_finished, release, second, 900)
            check = (await call("dev_evaluate", job=second, timeout_seconds=600))["job"]["name"]
            await asyncio.to_thread(_finished, release, check, 600)
            await call("submit", job=second)
            waited: dict[str, Any] = {"finished": False}
            while not waited["finished"]:
                waited = await call("jobs_wait", timeout_seconds=120)
        return episode, first, second, waited

    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        episode, first, second, ended = asyncio.run(chain(gateway))
    assert ended["outcome"] == "Scored" and ended["reward"] is not None, ended
    written = release.json("get", "agentjob", first)["status"]
    sizes = {a["path"]: a["size"] for a in written["artifacts"]}
    assert sizes["optimizer-state-00001-of-00002.raw"] == 3 << 30 and sum(sizes.values()) > 5 << 30
    resumed = release.json("get", "agentjob", second)["status"]
    assert resumed["phase"] == "Succeeded" and resumed["lineage"] == [first], resumed
    status = release.json("get", "episode", episode)["status"]
    score = release.json("get", "agentjob", status["scoringJob"])
    assert score["spec"]["flavor"] == "cpu-upgrade"
    _assert_settled_from_pod_run_time(release, episode)


def _mounted_repos(pod: dict[str, Any]) -> set[str]:
    """The store repos a job pod mounts (`repos/<kind>/<repo id>/<revision>` subpaths)."""
    return {
        mount["subPath"]
        for container in pod["spec"]["containers"]
        for mount in container.get("volumeMounts", [])
        if mount.get("subPath", "").startswith("repos/")
    }


def _created_job_pod(release: Release, job: str) -> dict[str, Any]:
    """The pod of a job the operator creates itself (the score job), once it exists; read while the
    episode scores (its pods go with its namespace when it ends, and scoring takes many seconds)."""

    def submitted() -> str | None:
        for item in release.json("get", "agentjobs")["items"]:
            if item["metadata"]["name"] == job:
                return (item.get("status") or {}).get("backendJobId")
        return None

    wait_for(submitted, timeout=300, interval=0.5, what=f"{job} to be submitted")
    return _job_pod(release, job)


@on_gvisor_only
def test_gsm8k_stand_in_on_pods(request: pytest.FixtureRequest, pods_release: Release) -> None:
    """The real task's code on its stand-in: trl's SFTTrainer in the trl environment, the dev grader on a
    sample of dev, the score over three seeds with its interval; only the score pod mounts hidden."""
    release = pods_release
    with standin_registry():
        hidden = get_task("gsm8k").hidden_split.repo_id
    script = (REPO / "examples" / "train_gsm8k_sft.py").read_text()

    async def play(gateway: str) -> tuple[dict[str, set[str]], str | None, str, dict[str, Any]]:
        observation = await scripted_sft_agent.reset_episode(
            gateway, release.orchestrator_token, "gsm8k", "pods"
        )
        token, episode = observation["metadata"]["agent_token"], observation["episode"]
        mounts: dict[str, set[str]] = {}
        async with scripted_sft_agent.agent_client(gateway, token) as session:
            call = functools.partial(scripted_sft_agent.call_tool, session)
            train = (await call("jobs_submit", script=script, timeout_seconds=2400))["job"]["name"]
            mounts["train"] = _mounted_repos(await asyncio.to_thread(_job_pod, release, train))
            trained = await asyncio.to_thread(_finished, release, train, 2400)
            assert trained["phase"] == "Succeeded", trained
            dev = (await call("dev_evaluate", job=train, timeout_seconds=1200))["job"]["name"]
            mounts["devEval"] = _mounted_repos(await asyncio.to_thread(_job_pod, release, dev))
            dev_status = await asyncio.to_thread(_finished, release, dev, 1200)
            await call("submit", job=train)
            score_pod = await asyncio.to_thread(_created_job_pod, release, f"{episode}-score")
            mounts["score"] = _mounted_repos(score_pod)
            waited: dict[str, Any] = {"finished": False}
            while not waited["finished"]:
                waited = await call("jobs_wait", timeout_seconds=120)
        return mounts, (dev_status.get("result") or {}).get("score"), episode, waited

    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        mounts, dev_score, episode, ended = asyncio.run(play(gateway))
    status = _assert_settled_from_pod_run_time(release, episode)
    say(
        request.config,
        f"\n[pods] gsm8k (stand-in)        {ended['outcome']:8} reward {ended['reward']} "
        f"{ended['reward_interval']} dev {dev_score}",
    )
    assert ended["outcome"] == "Scored" and float(ended["reward"]) > 0, ended
    assert ended["integrity"] == "clean", status.get("integrity")  # its scripts and outputs screened
    interval = status["rewardInterval"]
    assert float(interval["low"]) <= float(status["reward"]) <= float(interval["high"]), status
    assert ended["reward_interval"] == [interval["low"], interval["high"]]
    assert dev_score is not None
    assert any(hidden in subpath for subpath in mounts["score"]), mounts
    assert not any(hidden in subpath for purpose in ("train", "devEval") for subpath in mounts[purpose])


# Last: the longest (a CPU fine-tune of the tiny model).
@on_gvisor_only
def test_t0_arithmetic_format_on_pods(request: pytest.FixtureRequest, pods_release: Release) -> None:
    result = _play(request, pods_release, "t0_arithmetic_format")
    assert result.outcome == "Scored" and result.reward is not None, result
    assert float(result.reward) >= 0.9, result
    assert result.integrity == "clean", result
    _assert_settled_from_pod_run_time(pods_release, result.episode)
