"""The one builder of a kubernetes_asyncio client, for the operator and the gateway alike: where its
configuration comes from, its token file reread as it rotates, and its environment read once.

kubernetes_asyncio's session trusts the environment (`HTTPS_PROXY`/`NO_PROXY`, `~/.netrc`), which
aiohttp reads again on every request, in worker threads: two thread hand-offs per API call. The
builder reads it once for the client's one URL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import proxy_bypass

from aiohttp import ClientSession
from aiohttp.helpers import basicauth_from_netrc, netrc_from_env, proxies_from_env
from kubernetes_asyncio import client, config

from posttrain_operator.api.tokens import IN_CLUSTER_TOKEN, RereadTokenFile, kubeconfig_token_file

# kubernetes_asyncio's own read buffer (a watch event carries a whole object; etcd allows 1.5 MiB).
READ_BUFSIZE = 2**21


async def make_api_client(
    kubeconfig: str | None = None, *, user_agent: str | None = None
) -> client.ApiClient:
    """A client configured from the first of: `kubeconfig` as given; `KUBECONFIG`, read now
    (kubernetes_asyncio's default is the variable as it was at its import); the pod's ServiceAccount;
    `~/.kube/config`. A token file (the in-cluster token, or the kubeconfig's tokenFile) is reread as
    it rotates: kubernetes_asyncio reads it once."""
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    token_file: str | Path | None = None
    if not path:
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            token_file = IN_CLUSTER_TOKEN
        except config.ConfigException:
            path = str(Path.home() / ".kube" / "config")
    if path:
        await config.load_kube_config(config_file=path, client_configuration=cfg)
        token_file = kubeconfig_token_file(path)
    if token_file is not None:
        cfg.refresh_api_key_hook = RereadTokenFile(token_file)
    api_client = client.ApiClient(configuration=cfg)
    read_environment_once(api_client.rest_client, cfg.host)
    if user_agent is not None:
        api_client.user_agent = user_agent
    return api_client


def read_environment_once(rest_client: Any, url: str | None) -> None:
    """Read the environment once, for the client's one URL: when it names neither a proxy nor netrc
    credentials for it (the usual case), the session stops asking; otherwise it stays as it is."""
    if url is None or _environment_names(url, proxy_configured=bool(rest_client.proxy)):
        return
    # kubernetes_asyncio's `pool_manager` and aiohttp's `detach`, checked against kubernetes-asyncio
    # 36.1.0 and aiohttp 3.14.5 (tests/unit/test_pinned_upstream.py fails if either changes).
    session: ClientSession = rest_client.pool_manager
    connector = session.connector
    session.detach()  # the connector (its TLS context, its pool) goes to the new session
    rest_client.pool_manager = ClientSession(connector=connector, trust_env=False, read_bufsize=READ_BUFSIZE)


def _environment_names(url: str, *, proxy_configured: bool) -> bool:
    """Whether a session that trusts the environment takes anything from it for `url` (as aiohttp
    reads it): netrc credentials for its host, or, unless the configuration names a proxy, a proxy for
    its scheme that `NO_PROXY` does not bypass."""
    parts = urlsplit(url)
    host = parts.hostname
    if host is not None:
        try:
            basicauth_from_netrc(netrc_from_env(), host)
            return True
        except LookupError:
            pass
    if proxy_configured or (host is not None and proxy_bypass(host)):
        return False
    return parts.scheme in proxies_from_env()
