"""Helpers for tests that run `tlt worker` / `tlt drafter-trainer` "pods" as local processes."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on this machine right now."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_ip() -> str:
    """The address Ray itself picks for this machine (a driver finds its raylet by it)."""
    from ray._private.services import get_node_ip_address

    return str(get_node_ip_address())
