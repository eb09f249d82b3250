"""Watch-fed copies of one namespace's custom objects for `kube.Kube`: a `Mirror` lists a resource
once, then watches it into a `cache.Store`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException
from posttrain_operator.api.models import GROUP, VERSION

from env_gateway.cache import Store

Obj = dict[str, Any]
# The logger the mirror has always written to (it was part of kube): log filters keep working.
log = logging.getLogger("env_gateway.kube")


# How long one watch request runs before the server ends it and the mirror watches on from where it
# was (no new list); and the backoff bounds between failed attempts while the API server is away.
WATCH_SECONDS = 240
RETRY_MIN_SECONDS = 0.5
RETRY_MAX_SECONDS = 30.0


class Mirror:
    """One resource of one namespace, listed once and then watched into `store` (one watch per gateway
    process). A watch the server ends is resumed from the last version seen; a version the server no
    longer has (410, "too old") is answered by a fresh list, which replaces the store's content."""

    def __init__(self, custom: client.CustomObjectsApi, namespace: str, plural: str, store: Store) -> None:
        self.custom = custom
        self.namespace = namespace
        self.plural = plural
        self.store = store
        self.version: str | None = None  # where the next watch resumes; None: list first
        self.lists = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"mirror-{self.plural}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                if self.version is None:
                    await self._list()
                await self._watch()
                failures = 0
            except ApiException as exc:
                if exc.status == 410:  # the server forgot our version: only a new list can tell
                    log.info("%s watch expired (%s); listing again", self.plural, exc.reason)
                    self.version = None
                    continue
                failures += 1
                log.warning("%s watch failed (%s %s); retrying", self.plural, exc.status, exc.reason)
            except Exception as exc:  # the connection: the server restarting, a network blip
                failures += 1
                log.warning("%s watch failed (%r); retrying", self.plural, exc)
            if failures:
                await asyncio.sleep(min(RETRY_MAX_SECONDS, RETRY_MIN_SECONDS * 2 ** min(failures, 8)))

    async def _list(self) -> None:
        listed = await self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, self.plural)
        self.lists += 1
        version: str = listed["metadata"]["resourceVersion"]
        self.store.replace(listed["items"], version)
        self.version = version

    async def _watch(self) -> None:
        w = watch.Watch()
        try:
            stream = w.stream(
                self.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                self.plural,
                resource_version=self.version,
                timeout_seconds=WATCH_SECONDS,
                allow_watch_bookmarks=True,
            )
            async for event in stream:
                obj: Obj = event["raw_object"]
                kind = event["type"]
                if kind == "DELETED":
                    self.store.delete(obj)
                elif kind in ("ADDED", "MODIFIED"):
                    self.store.upsert(obj)
                self.version = obj["metadata"]["resourceVersion"]  # bookmarks too: a cheaper resume
        finally:
            w.stop()
            with contextlib.suppress(Exception):
                await w.close()
