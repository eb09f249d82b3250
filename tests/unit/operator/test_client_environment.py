"""The one builder of a kubernetes_asyncio client, the operator's and the gateway's: it chooses the
configuration in one order, and the client's HTTP session reads the environment (proxy variables,
~/.netrc) once, when it is made: a session that trusts it would read it again on every request, in
worker threads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from posttrain_operator import client_environment, k8s
from posttrain_operator.client_environment import read_environment_once

from env_gateway import kube as gateway_kube

API = "https://10.0.0.1:6443"


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No proxy variables, and a netrc path that does not exist (yet)."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


async def trusts_environment(proxy: str | None = None) -> bool:
    cfg = client.Configuration(host=API)
    cfg.proxy = proxy
    api = client.ApiClient(configuration=cfg)
    try:
        connector = api.rest_client.pool_manager.connector
        read_environment_once(api.rest_client, cfg.host)
        assert api.rest_client.pool_manager.connector is connector  # the same pool and TLS context
        trusts: bool = api.rest_client.pool_manager.trust_env
        return trusts
    finally:
        await api.close()


async def test_an_environment_that_names_nothing_for_the_api_server_is_not_read_again() -> None:
    assert not await trusts_environment()


async def test_a_proxy_for_the_api_server_keeps_the_environment_trusted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert await trusts_environment()
    monkeypatch.setenv("NO_PROXY", "10.0.0.1")  # bypassed for this host: nothing to read
    assert not await trusts_environment()


async def test_a_configured_proxy_wins_over_the_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert not await trusts_environment(proxy="http://configured:3128")


async def test_netrc_credentials_for_the_api_server_keep_the_environment_trusted(
    plain_environment: Path,
) -> None:
    plain_environment.write_text("machine elsewhere login a password b\n")
    assert not await trusts_environment()
    plain_environment.write_text("machine 10.0.0.1 login a password b\n")
    assert await trusts_environment()


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}', insecure-skip-tls-verify: true}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


async def test_both_clients_are_made_with_the_environment_read_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", API)))
    for api in (await k8s.make_api_client(), await gateway_kube.make_api_client(None)):
        try:
            assert api.configuration.host == API
            assert not api.rest_client.pool_manager.trust_env
        finally:
            await api.close()


async def test_one_builder_chooses_the_configuration_for_both_in_one_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A kubeconfig named by the caller, then KUBECONFIG, then (outside a pod) ~/.kube/config."""
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    named = write_kubeconfig(tmp_path / "named", "https://10.0.0.2:6443")
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "env", "https://10.0.0.3:6443")))
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    write_kubeconfig(home / ".kube" / "config", "https://10.0.0.4:6443")
    monkeypatch.setenv("HOME", str(home))
    chosen = [
        (await client_environment.make_api_client(str(named)), "https://10.0.0.2:6443"),
        (await gateway_kube.make_api_client(str(named)), "https://10.0.0.2:6443"),
        (await client_environment.make_api_client(), "https://10.0.0.3:6443"),
        (await gateway_kube.make_api_client(None), "https://10.0.0.3:6443"),
    ]
    monkeypatch.delenv("KUBECONFIG")
    chosen += [
        (await k8s.make_api_client(), "https://10.0.0.4:6443"),
        (await gateway_kube.make_api_client(None), "https://10.0.0.4:6443"),
    ]
    try:
        assert [api.configuration.host for api, _ in chosen] == [host for _, host in chosen]
    finally:
        for api, _ in chosen:
            await api.close()
