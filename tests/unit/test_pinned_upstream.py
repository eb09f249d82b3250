"""Four places lean on upstream internals, each checked against the version the lock file pins; these
tests fail when an upgrade changes what they lean on:

- `client_environment.read_environment_once` detaches an aiohttp session and hands its connector to
  a new one (aiohttp 3.14.5);
- `env_gateway.kube._retry_then_type_failures` replaces `rest_client.request`, through which every
  verb of kubernetes_asyncio's REST client goes (kubernetes-asyncio 36.1.0);
- `handlers._drop_observer_successes` drops kopf's log line for the observers' successes by its text
  (kopf 1.45.2);
- `lean_watch.install` wraps the watch stream kopf's watcher reads (kopf 1.45.2)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kopf
import pytest
from kopf._cogs.clients import watching
from kopf._cogs.structs import references
from kopf._core.actions import execution
from kopf._core.reactor import queueing
from kubernetes_asyncio import client
from kubernetes_asyncio.client import rest
from kubernetes_asyncio.client.exceptions import ApiException
from posttrain_operator import handlers, lean_watch
from posttrain_operator.client_environment import READ_BUFSIZE

from env_gateway.kube import Unavailable, _retry_then_type_failures

VERBS = ("GET", "HEAD", "OPTIONS", "DELETE", "POST", "PUT", "PATCH")


async def test_an_aiohttp_session_detached_leaves_its_connector_to_a_new_session() -> None:
    session = aiohttp.ClientSession()
    connector = session.connector
    assert connector is not None
    session.detach()
    assert session.connector is None and not connector.closed
    successor = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=READ_BUFSIZE)
    try:
        assert successor.connector is connector and not successor.trust_env
    finally:
        await successor.close()


async def test_every_verb_of_the_kubernetes_client_goes_through_its_request_attribute() -> None:
    rest_client = rest.RESTClientObject(client.Configuration(host="https://10.0.0.1:6443"))
    try:
        assert isinstance(rest_client.pool_manager, aiohttp.ClientSession)
        assert hasattr(rest_client, "proxy")

        async def server_away(*args: object, **kwargs: object) -> None:
            raise ApiException(status=503, reason="Service Unavailable")

        rest_client.request = server_away
        _retry_then_type_failures(rest_client)
        for verb in VERBS:
            with pytest.raises(Unavailable):
                await getattr(rest_client, verb)("https://10.0.0.1:6443/api")
    finally:
        await rest_client.close()


def test_kopf_logs_the_observers_success_in_the_words_the_filter_drops() -> None:
    observers = [
        h
        for h in kopf.get_default_registry()._watching.get_all_handlers()
        if h.id in ("agentjob_observe", "episode_observe")
    ]
    assert len(observers) == 2
    assert 'logger.info(f"{handler} succeeded.")' in inspect.getsource(execution.execute_handler_once)
    for observer in observers:
        line = logging.LogRecord(
            "kopf.objects", logging.INFO, __file__, 0, f"{observer} succeeded.", None, None
        )
        assert not handlers._drop_observer_successes(line)
    other = logging.LogRecord("kopf.objects", logging.INFO, __file__, 0, "Handler 'x' succeeded.", None, None)
    assert handlers._drop_observer_successes(other)


async def test_kopf_watcher_reads_the_wrapped_watch_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's watcher calls `watching.infinite_watch` through the module when it starts, so
    `lean_watch.install()` before the watchers start covers every event they hand to handlers."""
    managed = [{"manager": "kopf", "operation": "Update"}]
    event = {"type": None, "object": {"metadata": {"uid": "u1", "name": "j1", "managedFields": managed}}}

    async def stream(**kwargs: object) -> AsyncIterator[object]:
        yield event

    monkeypatch.setattr(watching, "infinite_watch", stream)
    lean_watch.install()
    handed: list[dict[str, Any]] = []

    async def processor(*, raw_event: dict[str, Any], **kwargs: object) -> None:
        handed.append(raw_event)

    settings = kopf.OperatorSettings()
    settings.queueing.idle_timeout = settings.queueing.exit_timeout = 0.01
    resource = references.Resource(group="posttrain.dev", version="v1", plural="agentjobs")
    await queueing.watcher(namespace=None, settings=settings, resource=resource, processor=processor)
    assert handed == [{"type": None, "object": {"metadata": {"uid": "u1", "name": "j1"}}}]
