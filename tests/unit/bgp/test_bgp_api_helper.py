"""api_helper.py as ExaBGP runs it: it hands its pipes to the agent and gets out of the way."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from bgp.speaker import HELPER


def _take_pipes(listener: socket.socket) -> tuple[socket.socket, int, int]:
    conn, _ = listener.accept()
    conn.settimeout(10)
    _, fds, _, _ = socket.recv_fds(conn, 64, 2)
    assert len(fds) == 2
    return conn, fds[0], fds[1]


def test_agent_reads_and_writes_exabgp_pipes_directly_and_reattaches(tmp_path: Path) -> None:
    path = str(tmp_path / "api.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(2)
    listener.settimeout(10)
    helper = subprocess.Popen(
        [sys.executable, str(HELPER), path], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert helper.stdin is not None and helper.stdout is not None
    try:
        conn, events, commands = _take_pipes(listener)
        helper.stdin.write(b'{"type": "state"}\n')  # ExaBGP -> helper's stdin -> agent
        helper.stdin.flush()
        assert os.read(events, 1024) == b'{"type": "state"}\n'
        os.write(commands, b"announce eor ipv4 unicast\n")  # agent -> helper's stdout
        assert helper.stdout.readline() == b"announce eor ipv4 unicast\n"
        for fd in (events, commands):
            os.close(fd)
        conn.close()  # the agent restarts: the helper attaches to the next one
        conn, events, commands = _take_pipes(listener)
        for fd in (events, commands):
            os.close(fd)
        helper.stdin.close()  # ExaBGP stops: the helper exits by itself
        assert helper.wait(timeout=10) == 0
        conn.close()
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()
        listener.close()
