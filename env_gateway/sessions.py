"""OpenEnv sessions of this process (`openenv/session/create`, one per `/ws` connection): each is the
orchestrator's, attached to at most one Episode by its `reset`."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from env_gateway.episode_view import EpisodeRef


@dataclass
class Session:
    id: str
    episode: EpisodeRef | None = None
    ws_attached: bool = False
    closing: bool = False


class Sessions:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_id: dict[str, Session] = {}

    def create(self) -> Session | None:
        if len(self._by_id) >= self.capacity:
            return None
        session = Session(id=str(uuid.uuid4()))
        self._by_id[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def close(self, session: Session) -> None:
        self._by_id.pop(session.id, None)

    def __len__(self) -> int:
        return len(self._by_id)
