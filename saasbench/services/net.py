"""Socket helpers shared by the TCP relays (the Docker loopback proxy, the gateway's relay)."""

from __future__ import annotations

import contextlib
import socket


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes from ``src`` to ``dst`` until EOF or an error, then half-close ``dst`` (so the
    peer sees the end of the stream while the other direction may still flow)."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
