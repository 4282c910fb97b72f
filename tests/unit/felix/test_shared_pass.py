"""Concurrent ADDs share dataplane passes: each is answered by a pass that saw it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from felix.shared_pass import SharedPass

WAIT_S = 30.0  # generous: a loaded 2-core machine must meet every wait here


class Registry:
    """Endpoints registered so far, and what each pass saw when it began."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.registered: list[int] = []
        self.seen_by_successful_passes: list[set[int]] = []
        self.first_pass_started = threading.Event()
        self.release_first_pass = threading.Event()
        self.fail_next = 0

    def run(self) -> None:
        with self.lock:
            snapshot = set(self.registered)
            failing = self.fail_next > 0
            self.fail_next -= failing
        if not self.first_pass_started.is_set():
            self.first_pass_started.set()
            assert self.release_first_pass.wait(WAIT_S)
        if failing:
            raise RuntimeError("iptables-restore failed")
        with self.lock:
            self.seen_by_successful_passes.append(snapshot)

    def register(self, endpoint: int) -> None:
        with self.lock:
            self.registered.append(endpoint)


def add(registry: Registry, shared: SharedPass, endpoint: int) -> int:
    """What an ADD does: register its endpoint, then wait for a pass covering it."""
    registry.register(endpoint)
    shared.run_covering()
    return endpoint


def test_serial_callers_each_run_a_pass() -> None:
    registry = Registry()
    registry.release_first_pass.set()
    shared = SharedPass(registry.run)
    for endpoint in range(3):
        add(registry, shared, endpoint)
    assert shared.passes == 3
    assert registry.seen_by_successful_passes == [{0}, {0, 1}, {0, 1, 2}]


def test_callers_that_arrive_during_a_pass_share_the_next_one() -> None:
    registry = Registry()
    shared = SharedPass(registry.run)
    with ThreadPoolExecutor(21) as pool:
        first = pool.submit(add, registry, shared, 0)
        assert registry.first_pass_started.wait(WAIT_S)
        others = [pool.submit(add, registry, shared, n) for n in range(1, 21)]
        _wait_until(lambda: len(registry.registered) == 21)
        registry.release_first_pass.set()
        done = [f.result(WAIT_S) for f in [first, *others]]
    assert sorted(done) == list(range(21))
    # The first pass saw only endpoint 0; all 20 latecomers shared one more pass
    # (a latecomer may still be between registering and asking: then it has a third).
    assert registry.seen_by_successful_passes[0] == {0}
    assert 2 <= shared.passes <= 3
    for endpoint in range(21):
        assert any(endpoint in seen for seen in registry.seen_by_successful_passes)


def test_no_caller_returns_before_a_pass_that_began_after_it_registered() -> None:
    """The invariant an ADD relies on (its policy is programmed), under contention."""
    registry = Registry()
    registry.release_first_pass.set()
    shared = SharedPass(registry.run)
    returned_after: dict[int, int] = {}

    def checked_add(endpoint: int) -> None:
        add(registry, shared, endpoint)
        with registry.lock:
            returned_after[endpoint] = len(registry.seen_by_successful_passes)
            covered = any(endpoint in s for s in registry.seen_by_successful_passes)
        assert covered, f"endpoint {endpoint} answered before a pass saw it"

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(checked_add, range(200)))
    assert len(returned_after) == 200
    assert 1 <= shared.passes <= 200


def test_a_failed_pass_fails_its_runner_and_the_waiters_run_their_own() -> None:
    registry = Registry()
    registry.fail_next = 1
    shared = SharedPass(registry.run)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(add, registry, shared, 0)
        assert registry.first_pass_started.wait(WAIT_S)
        waiters = [pool.submit(add, registry, shared, n) for n in (1, 2, 3)]
        _wait_until(lambda: len(registry.registered) == 4)
        registry.release_first_pass.set()
        with pytest.raises(RuntimeError, match="iptables-restore failed"):
            first.result(WAIT_S)
        assert sorted(f.result(WAIT_S) for f in waiters) == [1, 2, 3]
    for endpoint in (1, 2, 3):
        assert any(endpoint in seen for seen in registry.seen_by_successful_passes)


def test_a_caller_after_a_failure_is_not_answered_by_it() -> None:
    registry = Registry()
    registry.release_first_pass.set()
    registry.fail_next = 1
    shared = SharedPass(registry.run)
    with pytest.raises(RuntimeError):
        add(registry, shared, 0)
    add(registry, shared, 1)
    assert registry.seen_by_successful_passes == [{0, 1}]


def _wait_until(condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.002)
