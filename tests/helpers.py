"""Small helpers shared by the test tiers."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable


def wait_for(check: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll until check() is true; fail with `what` after timeout seconds.

    For effects the agent finishes after answering (a DEL's deferred teardown,
    a watch event): the test states the end state, not how fast it comes.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def settles(check: Callable[[], bool], timeout: float = 20.0, interval: float = 0.3) -> bool:
    """Poll check() every interval seconds; True once it holds, False after timeout.

    For assertions that carry their own message: `assert settles(f), state()`.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return False


_LISTEN = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
s.settimeout(20)
print(s.recvfrom(100)[1][0], flush=True)
"""

_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
for _ in range(100):  # until the listener (started just before) is bound
    s.sendto(b"hello", (sys.argv[3], int(sys.argv[4])))
    time.sleep(0.1)
"""


def udp_source_seen(
    sender_ns: str, sender: tuple[str, int], listener_ns: str, listener: tuple[str, int]
) -> str:
    """The source address a datagram from *sender* (address, port) in *sender_ns* has
    when it reaches *listener* in *listener_ns* (what NAT made of it); one way only,
    so no route back to the sender is needed. Empty if nothing arrived in 20 s."""
    listen = subprocess.Popen(
        ["ip", "netns", "exec", listener_ns, sys.executable, "-c", _LISTEN, *map(str, listener)],
        stdout=subprocess.PIPE,
        text=True,
    )
    send = subprocess.Popen(
        [
            "ip", "netns", "exec", sender_ns, sys.executable, "-c", _SEND,
            *map(str, sender), *map(str, listener),
        ]
    )  # fmt: skip
    try:
        out, _ = listen.communicate(timeout=30)
    finally:
        send.kill()
        send.wait()
        if listen.poll() is None:
            listen.kill()
            listen.wait()
    return out.strip()
