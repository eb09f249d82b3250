"""Ports picked for one process's listeners differ: a port picked and not yet bound is free, so the
kernel may hand it out again."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from devstack.controlplane import cluster


class _Socket:
    """A socket that binds to the next port of a script, as the kernel might choose them."""

    ports: list[int] = []

    def __init__(self, *_: Any) -> None:
        self.port = 0

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def bind(self, _: tuple[str, int]) -> None:
        self.port = self.ports.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return "127.0.0.1", self.port


def test_a_port_to_avoid_is_skipped_when_the_kernel_hands_it_out_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_Socket, "ports", [40001, 40001, 40001, 40002])
    monkeypatch.setattr(cluster.socket, "socket", _Socket)
    first = cluster.free_port()
    assert cluster.free_port(avoid={first}) == 40002


def test_a_real_pick_is_a_port_that_can_be_bound() -> None:
    port = cluster.free_port(avoid={1})
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
