"""HF emulator test helpers: the client's HTTP timeout."""

from __future__ import annotations

import httpx2
from huggingface_hub import set_client_factory
from huggingface_hub.utils import _http

CLIENT_TIMEOUT = 10.0


def install_client_timeout(seconds: float) -> None:
    """The client has no HTTP timeout by default (docs/hf-jobs-api.md, "The client"): install one."""
    set_client_factory(
        lambda: httpx2.Client(
            event_hooks={"request": [_http.hf_request_event_hook]},
            follow_redirects=True,
            timeout=httpx2.Timeout(seconds),
        )
    )
