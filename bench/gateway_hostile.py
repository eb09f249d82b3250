"""The gateway under hostile input: the seeded corpus of the fuzz test (depth, lone surrogates and
invalid UTF-8, huge numbers, wrong types for every tool argument, batches, non-JSON, binary frames)
sent over the OpenEnv `/mcp` dialect, an MCP SDK session and `/ws` at once, beside a well-behaved MCP
client, for a few rounds of different seeds, against the devstack control plane.

    python bench/gateway_hostile.py [--devstack NAME] [--rounds 3]

Prints p50/p99/max latency per surface and every outcome, and the faults (5xx, no answer, a websocket
closed without a code) if any. No operator runs: refusing input needs none, and an Episode made here
with kubectl makes the agent token valid. Client and gateway share one process, as in the test.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import secrets
import tempfile
import uuid
from pathlib import Path

from devstack.controlplane import cluster as devcluster
from env_gateway.config import GatewaySettings
from tests.helpers import make_kubectl
from tests.integration.gateway import hostile
from tests.integration.gateway.support import GatewayServer, serve
from tests.integration.support import episode_manifest

REPO = Path(__file__).resolve().parents[1]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devstack", default="default")
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    state = devcluster.load_state(opts.devstack)
    assert state is not None, f"no devstack cluster {opts.devstack!r}: python -m devstack cluster up"
    kubectl = make_kubectl(state)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", namespace)
    agent_token = secrets.token_urlsafe(32)
    manifest = episode_manifest("bench", agentTokenHash=hashlib.sha256(agent_token.encode()).hexdigest())
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(manifest))
    token_file = Path(tempfile.mkdtemp()) / "token"
    token_file.write_text("unused")
    orchestrator_token = secrets.token_urlsafe(16)
    settings = GatewaySettings(
        namespace=namespace, orchestrator_token=orchestrator_token,  # type: ignore[arg-type]
        kubeconfig=str(state.kubeconfig), broker_token_file=str(token_file),
    )  # fmt: skip
    try:
        for url in serve(settings):
            gw = GatewayServer(url, orchestrator_token, namespace)
            orchestrator = gw.orchestrator_headers()
            seen: list[hostile.Seen] = []
            for round_ in range(opts.rounds):
                seed = 19 + 3 * round_  # each round draws a different corpus
                seen += await hostile.run(url, gw.ws_url, orchestrator, "bench", agent_token, seed)
            print(f"{opts.rounds} rounds, {len(seen)} requests and frames")
            print(hostile.report(seen))
            faults = [s for s in seen if s.fault is not None]
            print(f"faults: {len(faults)}")
            for s in faults[:20]:
                print(f"  {s.surface} {s.kind}: {s.fault}")
    finally:
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)


if __name__ == "__main__":
    asyncio.run(main())
