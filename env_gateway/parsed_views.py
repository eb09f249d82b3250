"""The gateway's one memo of parsed Episode bodies, kept apart from the pure reads of `episode_view`.

A tool call reads its Episode several times (authentication, the step limit, the written step), mostly
the very body the watch-fed store holds; `parse_episode` parses each body once: it keeps the views of
the last few hundred bodies it parsed, by name and resourceVersion, and answers with one only for that
same body object (bodies are never modified; every write comes back as a new object with a new
resourceVersion)."""

from __future__ import annotations

from typing import Any

from env_gateway.episode_view import EpisodeView

# How many parsed bodies are kept (the oldest parsed goes first): a few per episode in flight is
# enough, as each call reads the newest version its store holds.
PARSED_VIEWS = 256


class ParsedViews:
    """The views of the last `size` versioned bodies parsed, each served for its own body object only."""

    def __init__(self, size: int = PARSED_VIEWS) -> None:
        self.size = size
        self._views: dict[tuple[str, str, str], EpisodeView] = {}

    def __len__(self) -> int:
        return len(self._views)

    def parse(self, body: dict[str, Any]) -> EpisodeView:
        """`EpisodeView.parse(body)`, or the view parsed before from this same body object."""
        metadata = body["metadata"]
        version = metadata.get("resourceVersion")
        key = (metadata["namespace"], metadata["name"], version) if isinstance(version, str) else None
        if key is not None:
            held = self._views.get(key)
            if held is not None and held.body is body:
                return held
        view = EpisodeView.parse(body)
        if key is not None:
            self._views.pop(key, None)
            if len(self._views) >= self.size:
                del self._views[next(iter(self._views))]
            self._views[key] = view
        return view


# The gateway process's memo: every surface reads its Episodes through it.
VIEWS = ParsedViews()


def parse_episode(body: dict[str, Any]) -> EpisodeView:
    return VIEWS.parse(body)
