"""The operator process's environment on this machine: what the devstack (`stack.py`) and the
integration tests both start `kopf run` with, so the two run the operator the same way."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path


def operator_env(
    inherited: Mapping[str, str],
    *,
    kubeconfig: Path,
    hf_endpoint: str,
    hf_token: str,
    hf_namespace: str,
    hf_bucket: str,
    broker_port: int,
    metrics_port: int,
    broker_allowed_users: list[str],
    **settings: str,
) -> dict[str, str]:
    """`inherited` (e.g. `os.environ`) less any of our settings, then the HF backend on the emulator,
    the broker and metrics on loopback, and `settings`: more `POSTTRAIN_*` values (poll periods...)."""
    env = {k: v for k, v in inherited.items() if not k.startswith(("POSTTRAIN_", "GATEWAY_", "HF_"))}
    env.update(
        KUBECONFIG=str(kubeconfig),
        HF_HUB_DISABLE_TELEMETRY="1",
        POSTTRAIN_HF_ENDPOINT=hf_endpoint,
        POSTTRAIN_HF_TOKEN=hf_token,
        POSTTRAIN_HF_NAMESPACE=hf_namespace,
        POSTTRAIN_HF_BUCKET=hf_bucket,
        # The emulator's jail gives each job a network namespace holding lo alone.
        POSTTRAIN_HF_JOBS_LOOPBACK="true",
        POSTTRAIN_BROKER_HOST="127.0.0.1",
        POSTTRAIN_BROKER_PORT=str(broker_port),
        POSTTRAIN_BROKER_ALLOWED_USERS=json.dumps(broker_allowed_users),
        POSTTRAIN_METRICS_HOST="127.0.0.1",
        POSTTRAIN_METRICS_PORT=str(metrics_port),
    )
    env.update(settings)
    return env
