"""Small helpers shared by the test tiers."""

from __future__ import annotations

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
