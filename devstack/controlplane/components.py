"""The control plane's command lines (etcd, kube-apiserver, kube-controller-manager), from a cluster's
run dir (its `pki/`, kubeconfigs and audit policy): pure, so `cluster.py` only starts and waits."""

from __future__ import annotations

from pathlib import Path

SERVICE_CIDR = "10.96.0.0/16"


def etcd_args(run_dir: Path, client_url: str, peer_url: str) -> list[str]:
    return [
        "--name=devstack",
        f"--data-dir={run_dir / 'etcd'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=devstack={peer_url}",
        "--unsafe-no-fsync",
        "--quota-backend-bytes=2147483648",
        "--log-level=warn",
    ]


def apiserver_args(run_dir: Path, etcd_url: str, port: int, audit_log: Path) -> list[str]:
    pki_dir = run_dir / "pki"
    return [
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
        f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
        f"--client-ca-file={pki_dir / 'ca.crt'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki_dir / 'sa.pub'}",
        f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        f"--audit-policy-file={run_dir / 'audit-policy.yaml'}",
        f"--audit-log-path={audit_log}",
        # Tests read the log from an offset; the default rotation at 100 MB moved a whole suite's
        # entries out from under one of them. One run writes a few hundred MB at most.
        "--audit-log-maxsize=4096",
        "--audit-log-maxbackup=1",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_args(run_dir: Path) -> list[str]:
    pki_dir, kubeconfig = run_dir / "pki", run_dir / "kcm.kubeconfig"
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        f"--root-ca-file={pki_dir / 'ca.crt'}",
        f"--service-account-private-key-file={pki_dir / 'sa.key'}",
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={pki_dir / 'ca.crt'}",
        f"--cluster-signing-key-file={pki_dir / 'ca.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--controllers=*",
        "--v=1",
    ]
