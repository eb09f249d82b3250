"""Bearer tokens that rotate: a ServiceAccount token projected into a pod (the kubelet replaces it
well before it expires) or named by a kubeconfig's `tokenFile`. kubernetes_asyncio reads a kubeconfig's
token file once, so a long-running client would start answering 401 once the token expires; this hook
rereads the file whenever it changed. Shared by the operator and the gateway; no client import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class RereadTokenFile:
    """A `Configuration.refresh_api_key_hook`: sets the bearer token from `path`, rereading the file
    when its identity, size or mtime changed (a stat per request; the projected volume swaps a
    symlink). A missing or empty file keeps the last token rather than sending none."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._token: str | None = None

    def current(self) -> str | None:
        try:
            st = self.path.stat()
        except OSError:
            return self._token
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._stamp:
            try:
                token = self.path.read_text().strip()
            except OSError:
                return self._token
            if token:
                self._token, self._stamp = token, stamp
        return self._token

    def __call__(self, configuration: Any, *_: Any) -> None:
        token = self.current()
        if token:
            configuration.api_key["BearerToken"] = f"Bearer {token}"


def kubeconfig_token_file(path: str | Path, context: str | None = None) -> Path | None:
    """The `tokenFile` of the kubeconfig's current (or named) context's user, resolved against the
    kubeconfig's directory as kubectl does; None when the user has none."""
    config = yaml.safe_load(Path(path).read_text()) or {}
    context_name = context or config.get("current-context")
    ctx = next((c["context"] for c in config.get("contexts") or [] if c.get("name") == context_name), None)
    if not ctx:
        return None
    user = next(
        (u.get("user") or {} for u in config.get("users") or [] if u.get("name") == ctx.get("user")), {}
    )
    token_file = user.get("tokenFile")
    if not token_file:
        return None
    resolved = Path(token_file)
    return resolved if resolved.is_absolute() else Path(path).parent / resolved
