#!/usr/bin/env python3
"""ExaBGP's API process for Tabby: hands its own pipes to the agent, copies nothing.

ExaBGP forks this program (the `process` block of the config), writes events to
its stdin and reads commands from its stdout. The agent is a separate process
(ExaBGP is its child, not the other way round), so this helper connects to the
agent's unix socket and passes it both pipe ends (SCM_RIGHTS): from then on the
agent reads ExaBGP's events and writes its commands directly, with no relay
process in between (one hop less each way, which a route reflector pays twice).

While no agent is attached, the helper reads and drops the events itself, so
ExaBGP never blocks on a full pipe (the agent rebuilds its view from the `up`
events and replays that follow its attach); it exits when ExaBGP closes its
stdin. It is deliberately standalone (standard library only, no Tabby imports):
ExaBGP runs it with its own interpreter, and it can die and be respawned by
ExaBGP without losing anything.

Usage: api_helper.py <agent unix socket path>
"""

from __future__ import annotations

import os
import select
import socket
import sys

RETRY_SECONDS = 0.2
STDIN, STDOUT = 0, 1
HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL


def connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def drain(timeout: float) -> bool:
    """Read and drop ExaBGP's events for up to `timeout`; False once stdin is closed."""
    poller = select.poll()
    poller.register(STDIN, select.POLLIN)
    for _, event in poller.poll(timeout * 1000):
        if event & select.POLLIN:
            return bool(os.read(STDIN, 65536))
        if event & HANGUP:
            return False
    return True


def attached(sock: socket.socket) -> bool:
    """The agent holds our pipes: wait until it lets go (True) or ExaBGP stops (False)."""
    poller = select.poll()
    poller.register(STDIN, 0)  # hang-up only: the data is the agent's to read
    poller.register(sock.fileno(), select.POLLIN)
    while True:
        for fd, event in poller.poll():
            if fd == STDIN and event & HANGUP:
                return False
            if fd == sock.fileno():
                try:
                    if sock.recv(1024):
                        continue  # nothing is expected from the agent; ignore it
                except OSError:
                    pass
                return True


def serve(path: str) -> int:
    """Attach to the agent (again after each agent restart) until ExaBGP stops."""
    while True:
        sock = connect(path)
        if sock is None:
            if not drain(RETRY_SECONDS):
                return 0  # ExaBGP closed our stdin: it is stopping
            continue
        try:
            socket.send_fds(sock, [b"tabby-api"], [STDIN, STDOUT])
            if not attached(sock):
                return 0
        except OSError:
            pass  # the agent went away while we attached: try again
        finally:
            sock.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: api_helper.py <agent unix socket>\n")
        sys.exit(2)
    sys.exit(serve(sys.argv[1]))
