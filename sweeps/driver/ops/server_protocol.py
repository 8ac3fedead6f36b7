"""The team store's HTTP protocol for uvicorn: its own, with TCP_NODELAY on every connection.

uvicorn with more than one worker binds the listening socket itself (`socket.socket(family)`,
protocol number 0), and CPython's asyncio sets TCP_NODELAY on an accepted connection only where
`sock.proto == IPPROTO_TCP`: so no connection of the MLflow server had it. A reply leaves in two
writes (headers, then body); Nagle's algorithm holds the body until the client acknowledges the
headers, and on a kept-alive connection Linux's client delays that ACK by 40 ms. Every request a
sweep driver made waited those 40 ms (strace of both ends, docs/team-store.md).
"""
from __future__ import annotations

import asyncio
import socket

from uvicorn.protocols.http.auto import AutoHTTPProtocol


class NoDelayHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        connection = transport.get_extra_info("socket")
        if connection is not None and connection.family in (socket.AF_INET, socket.AF_INET6):
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
