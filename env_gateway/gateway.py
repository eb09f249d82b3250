"""The gateway's two halves, built together once there is a Kubernetes client: who the caller is
(`auth`), and what a caller may do to its episode (`episodes`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from env_gateway.auth import Authenticator
from env_gateway.broker import BrokerClient
from env_gateway.config import GatewaySettings
from env_gateway.episodes import Episodes
from env_gateway.kube import Kube, make_api_client
from env_gateway.metrics import GatewayMetrics
from env_gateway.tools import TOOLS


@dataclass(frozen=True)
class Gateway:
    settings: GatewaySettings
    auth: Authenticator
    episodes: Episodes


@contextlib.asynccontextmanager
async def open_gateway(
    settings: GatewaySettings, kube: Kube | None = None, metrics: GatewayMetrics | None = None
) -> AsyncIterator[Gateway]:
    """The gateway and its clients (Kubernetes, the operator's broker), closed on the way out; a `kube`
    given by the caller stays the caller's. Yields once the namespace's Episodes and AgentJobs are
    mirrored (so the app is not ready before it can answer from them)."""
    own_kube = kube is None
    k = kube or Kube(await make_api_client(settings.kubeconfig))
    broker = BrokerClient(settings.broker_url, settings.broker_token_file)
    metrics = metrics or GatewayMetrics(frozenset(TOOLS))
    auth = Authenticator(settings, k, metrics)
    try:
        async with k.mirrored(settings.namespace):
            yield Gateway(settings, auth, Episodes(settings, k, broker, auth, metrics=metrics))
    finally:
        await broker.close()
        if own_kube:
            await k.close()
