"""DEL's slow half, finished after the runtime has its answer.

Deleting a veth costs the kernel an RCU grace period (10-20 ms here, most of a
DEL), and the runtime waits for nothing that follows it: once DEL says done it
destroys the sandbox's netns, which would take the pair down anyway. So DEL
unlists the endpoint, writes a marker and answers; a small pool of workers then
deletes the veth (its /32 route goes with it), and only after that releases the
address, so no new pod is given an address that is still routed to the old one.

A teardown that fails (the apiserver away, say) is tried again after a growing
delay, on a timer so that it holds no worker, until it succeeds: the runtime was
told the DEL is done and will not send it again, so nobody else would. Any later
call for the same host interface (the same pod re-created, a repeated DEL, a
CHECK) waits for that pod's teardown first, and is told to try again later if it
is still failing. A marker left by an agent that died mid-teardown, or stopped
while one was failing, is finished by :func:`felix.cni_server.recover_after_restart`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

log = logging.getLogger(__name__)

WORKERS = 4
RETRY_DELAYS_S = (0.2, 1.0, 3.0, 10.0, 30.0)  # then every 30 s until it succeeds
WAIT_S = 60.0  # how long a call for the same pod waits for its teardown
PREVIOUS_WAIT_S = 60.0  # a newer teardown of the same key waits this long for the older


class Teardowns:
    """Deferred teardowns keyed by host interface; one per key at a time."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="teardown")
        self._pending: dict[str, Future[None]] = {}
        self._timers: set[threading.Timer] = set()
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, key: str, work: Callable[[], None]) -> None:
        """Run *work* in the background until it succeeds; calls for *key* wait for it."""
        done: Future[None] = Future()
        with self._lock:
            previous = self._pending.get(key)
            self._pending[key] = done
        done.add_done_callback(lambda finished: self._forget(key, finished))
        self._pool.submit(self._first, key, previous, work, done)

    def wait(self, key: str, timeout: float | None = None) -> bool:
        """Block until no teardown of *key* is pending (a no-op in the common case);
        False if one still is after *timeout* (default :data:`WAIT_S`: it keeps failing)."""
        with self._lock:
            future = self._pending.get(key)
        if future is None:
            return True
        try:
            future.result(timeout=WAIT_S if timeout is None else timeout)
        except FutureTimeout:
            return False
        return True

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait for every pending teardown; False if some were still running at the end."""
        deadline = time.monotonic() + timeout
        while self.pending():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is queued (bounded), then stop the workers and the retries."""
        if self._closed:
            return
        if not self.drain(timeout):
            log.warning(
                "stopping with %d teardowns unfinished; restart recovery ends them", self.pending()
            )
        with self._lock:
            self._closed = True
            timers, self._timers = self._timers, set()
        for timer in timers:
            timer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _first(
        self, key: str, previous: Future[None] | None, work: Callable[[], None], done: Future[None]
    ) -> None:
        if previous is not None:  # keep per-key order (callers wait for it: rarely here)
            with contextlib.suppress(FutureTimeout):
                previous.exception(timeout=PREVIOUS_WAIT_S)
        self._attempt(key, work, done, 0)

    def _attempt(self, key: str, work: Callable[[], None], done: Future[None], tried: int) -> None:
        try:
            work()
        except Exception:
            delay = RETRY_DELAYS_S[min(tried, len(RETRY_DELAYS_S) - 1)]
            log.warning(
                "teardown of %s failed (attempt %d); retrying in %g s",
                key,
                tried + 1,
                delay,
                exc_info=tried + 1 == len(RETRY_DELAYS_S),  # the trace once, not every 30 s
            )
            self._retry_later(delay, key, work, done, tried + 1)
            return
        done.set_result(None)

    def _retry_later(
        self, delay: float, key: str, work: Callable[[], None], done: Future[None], tried: int
    ) -> None:
        def fire() -> None:
            with self._lock:
                self._timers.discard(timer)
                if self._closed:
                    return  # the marker stands: restart recovery finishes it
            self._pool.submit(self._attempt, key, work, done, tried)

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        with self._lock:
            if self._closed:
                return
            self._timers.add(timer)
        timer.start()

    def _forget(self, key: str, done: Future[None]) -> None:
        with self._lock:
            if self._pending.get(key) is done:
                del self._pending[key]
