"""The proxy and netrc environment of a kubernetes_asyncio client, read once.

kubernetes_asyncio's session trusts the environment (`HTTPS_PROXY`/`NO_PROXY`, `~/.netrc`), which
aiohttp reads again on every request, in worker threads: two thread hand-offs per API call, in the
operator and the gateway alike. Both make their client through here."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit
from urllib.request import proxy_bypass

from aiohttp import ClientSession
from aiohttp.helpers import basicauth_from_netrc, netrc_from_env, proxies_from_env

# kubernetes_asyncio's own read buffer (a watch event carries a whole object; etcd allows 1.5 MiB).
READ_BUFSIZE = 2**21


def read_environment_once(rest_client: Any, url: str | None) -> None:
    """Read the environment once, for the client's one URL: when it names neither a proxy nor netrc
    credentials for it (the usual case), the session stops asking; otherwise it stays as it is."""
    if url is None or _environment_names(url, proxy_configured=bool(rest_client.proxy)):
        return
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
