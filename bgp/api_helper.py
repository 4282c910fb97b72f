#!/usr/bin/env python3
"""ExaBGP's API process for Tabby: a thin relay between ExaBGP and the agent.

ExaBGP forks this program (the `process` block of the config), writes events to
its stdin and reads commands from its stdout. The agent is a separate process
(ExaBGP is its child, not the other way round), so this relay connects to the
agent's unix socket and copies lines both ways, flushing after each command.

It is deliberately standalone (standard library only, no Tabby imports): ExaBGP
runs it with its own interpreter and environment, and a relay with no state can
die and be respawned by ExaBGP without losing anything. While the agent socket is
unreachable, events are dropped (the agent rebuilds its view from the `up` events
and replays that follow its reconnect) and the relay keeps retrying.

Usage: api_helper.py <agent unix socket path>
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import time

RETRY_SECONDS = 0.2


def connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def relay(path: str) -> int:
    """Copy stdin lines to the agent and agent lines to stdout until stdin closes."""
    stdin = sys.stdin.fileno()
    stdout = sys.stdout.buffer
    sel = selectors.DefaultSelector()
    sel.register(stdin, selectors.EVENT_READ, "exabgp")
    sock: socket.socket | None = None
    next_try = 0.0
    while True:
        if sock is None and time.monotonic() >= next_try:
            sock = connect(path)
            next_try = time.monotonic() + RETRY_SECONDS
            if sock is not None:
                sel.register(sock, selectors.EVENT_READ, "agent")
        for key, _ in sel.select(timeout=RETRY_SECONDS):
            if key.data == "exabgp":
                data = os.read(stdin, 65536)
                if not data:
                    return 0  # ExaBGP closed our stdin: it is stopping
                if sock is not None:
                    try:
                        sock.sendall(data)
                    except OSError:
                        sel.unregister(sock)
                        sock.close()
                        sock = None
            elif sock is not None:
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""  # the agent went away: reconnect
                if not data:
                    sel.unregister(sock)
                    sock.close()
                    sock = None
                    continue
                stdout.write(data)
                stdout.flush()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: api_helper.py <agent unix socket>\n")
        sys.exit(2)
    sys.exit(relay(sys.argv[1]))
