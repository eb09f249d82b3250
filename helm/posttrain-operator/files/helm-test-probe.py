"""`helm test`: the gateway and the operator answer on their Services. The gateway's /health, the
operator's readiness (/healthz on its broker port: each backend's credentials), then one scripted
exchange on the gateway's orchestrator surface: open a session, list the agent's tools, close it.
No Episode is created. Exits non-zero, saying which step failed, when any does (a gateway scaled to
zero has no endpoints: the first step cannot connect). A connection refused or timed out is tried
again for a while: a NetworkPolicy controller admits a new pod's traffic a few seconds after it
starts, not at once."""

import json
import os
import sys
import time
import urllib.error
import urllib.request

GATEWAY = os.environ["GATEWAY_URL"]
OPERATOR = os.environ["OPERATOR_URL"]
HOST = os.environ.get("GATEWAY_HOST", "")
TOKEN = os.environ["ORCHESTRATOR_TOKEN"]
TIMEOUT = float(os.environ.get("PROBE_TIMEOUT_SECONDS", "10"))
CONNECT_FOR = float(os.environ.get("PROBE_CONNECT_SECONDS", "60"))


def call(step, url, body=None, headers=None):
    deadline = time.monotonic() + CONNECT_FOR
    while True:
        request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode())
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            sys.exit(f"FAIL {step}: {url} answered {exc.code}: {exc.read()[:300].decode(errors='replace')}")
        except ValueError as exc:
            sys.exit(f"FAIL {step}: {url}: {exc}")
        except OSError as exc:  # refused, unreachable, timed out: perhaps not admitted yet
            if time.monotonic() >= deadline:
                sys.exit(f"FAIL {step}: {url}: {exc}")
            time.sleep(2)


def rpc(step, method, params):
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    if HOST:
        headers["Host"] = HOST
    request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = call(step, f"{GATEWAY}/mcp", request, headers)
    if "result" not in answer:
        sys.exit(f"FAIL {step}: {method} answered {json.dumps(answer)[:300]}")
    return answer["result"]


health = call("gateway health", f"{GATEWAY}/health", headers={"Host": HOST} if HOST else None)
if health.get("status") != "healthy":
    sys.exit(f"FAIL gateway health: {health}")
print("ok gateway /health")
ready = call("operator readiness", f"{OPERATOR}/healthz")
if ready.get("status") != "ok":
    sys.exit(f"FAIL operator readiness: {ready}")
backends = ", ".join(ready.get("backends", {})) or "none"
print(f"ok operator /healthz ({ready.get('role')}; backends: {backends})")
session = rpc("session", "openenv/session/create", {})["session_id"]
tools = [tool["name"] for tool in rpc("tools/list", "tools/list", {"session_id": session})["tools"]]
if not tools:
    sys.exit("FAIL tools/list: the gateway listed no tools")
rpc("session close", "openenv/session/close", {"session_id": session})
print(f"ok gateway tools/list: {' '.join(sorted(tools))}")
