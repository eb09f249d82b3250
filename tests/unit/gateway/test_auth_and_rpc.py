"""Authentication apart from episode handling, over an in-memory Episode store: who a token is, and what
the JSON-RPC dialect serves a caller that has no episode yet (no tools/call, everything else)."""

from __future__ import annotations

import hashlib
from typing import Any, cast

import pytest

from env_gateway.auth import Authenticator, AuthFailure
from env_gateway.broker import BrokerClient
from env_gateway.config import GatewaySettings
from env_gateway.episode_view import EpisodeRef
from env_gateway.episodes import Episodes
from env_gateway.gateway import Gateway
from env_gateway.kube import Kube
from env_gateway.rpc import Caller, dispatch_rpc
from env_gateway.sessions import Sessions

ORCHESTRATOR = "orchestrator-token"


class EpisodeStore:
    """The reads authentication makes, over a dict (name -> body); counts the lists."""

    def __init__(self) -> None:
        self.episodes: dict[str, dict[str, Any]] = {}
        self.lists = 0

    def add(self, name: str, token: str) -> None:
        self.episodes[name] = {
            "metadata": {"namespace": "ns", "name": name, "resourceVersion": "1"},
            "spec": {
                "task": "t0_artifact",
                "budgetUSD": "0.05",
                "backend": "hf-jobs",
                "agentTokenHash": hashlib.sha256(token.encode()).hexdigest(),
            },
            "status": {"phase": "Running", "steps": 0},
        }

    async def get_episode(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.episodes.get(name) if namespace == "ns" else None

    read_episode = get_episode

    async def list_episodes(self, namespace: str, *, fresh: bool = False) -> list[dict[str, Any]]:
        self.lists += 1
        return list(self.episodes.values()) if namespace == "ns" else []

    async def set_steps(
        self, namespace: str, name: str, current: dict[str, Any], steps: int
    ) -> dict[str, Any]:
        raise AssertionError("no tool call here may count a step")

    async def append_provenance(self, namespace: str, body: dict[str, Any]) -> bool:
        raise AssertionError("no tool call here is counted, so none is recorded")

    list_provenance = append_provenance


@pytest.fixture
def store() -> EpisodeStore:
    return EpisodeStore()


@pytest.fixture
def gateway(store: EpisodeStore) -> Gateway:
    settings = GatewaySettings(namespace="ns", orchestrator_token=ORCHESTRATOR)  # type: ignore[arg-type]
    kube = cast(Kube, store)
    auth = Authenticator(settings, kube)
    broker = cast(BrokerClient, None)  # never reached: no tool runs here
    return Gateway(settings, auth, Episodes(settings, kube, broker, auth))


async def refused(gateway: Gateway, token: str | None) -> tuple[int, str]:
    with pytest.raises(AuthFailure) as failure:
        await gateway.auth.agent_episode(token)
    return failure.value.status, failure.value.code


async def test_an_agent_token_is_its_episode_and_nothing_else_is(
    gateway: Gateway, store: EpisodeStore
) -> None:
    store.add("ep-a", "token-a")
    assert (await gateway.auth.agent_episode("token-a")).name == "ep-a"
    assert await refused(gateway, None) == (401, "missing_token")
    assert await refused(gateway, ORCHESTRATOR) == (403, "wrong_surface")
    assert await refused(gateway, "token-b") == (401, "invalid_token")
    # A token two Episodes claim binds to neither.
    store.add("ep-b", "shared")
    store.add("ep-c", "shared")
    assert await refused(gateway, "shared") == (401, "invalid_token")


async def test_an_issued_token_needs_no_list_and_is_checked_again_each_time(
    gateway: Gateway, store: EpisodeStore
) -> None:
    store.add("ep-a", "token-a")
    gateway.auth.issued("token-a", "ep-a")
    assert (await gateway.auth.agent_episode("token-a")).name == "ep-a"
    assert store.lists == 0
    del store.episodes["ep-a"]  # deleted: its token is revoked at once, the cache notwithstanding
    assert await refused(gateway, "token-a") == (401, "invalid_token")


@pytest.mark.parametrize("caller", ["ws", "orchestrator session"])
async def test_without_an_episode_only_tools_call_is_refused(gateway: Gateway, caller: str) -> None:
    sessions = Sessions(4)
    session = sessions.create()
    assert session is not None
    params: dict[str, Any] = {}
    who = Caller(over_ws=True)
    if caller == "orchestrator session":
        params, who = {"session_id": session.id}, Caller(token=ORCHESTRATOR)

    async def ask(method: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, **(extra or {})}}
        answer = await dispatch_rpc(gateway, sessions, message, who)
        assert answer is not None
        return answer

    assert (await ask("ping"))["result"] == {}
    assert len((await ask("tools/list"))["result"]["tools"]) == 9
    call = await ask("tools/call", {"name": "task_info", "arguments": {}})
    assert call["error"]["code"] == -32602 and "no episode" in call["error"]["message"]


async def test_an_agent_token_reaches_only_its_own_episodes_session(
    gateway: Gateway, store: EpisodeStore
) -> None:
    store.add("ep-a", "token-a")
    store.add("ep-b", "token-b")
    sessions = Sessions(4)
    session = sessions.create()
    assert session is not None
    session.episode = EpisodeRef("ns", "ep-a")
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"session_id": session.id}}
    agent_b = await gateway.auth.agent_episode("token-b")
    with pytest.raises(AuthFailure) as failure:
        await dispatch_rpc(gateway, sessions, message, Caller(token="token-b", agent=agent_b))
    assert (failure.value.status, failure.value.code) == (403, "wrong_episode")
    own = await dispatch_rpc(gateway, sessions, message, Caller(token="token-a"))
    assert own is not None and len(own["result"]["tools"]) == 9
