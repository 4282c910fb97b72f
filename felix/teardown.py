"""DEL's slow half, finished after the runtime has its answer.

Deleting a veth costs the kernel an RCU grace period (10-20 ms here, most of a
DEL), and the runtime waits for nothing that follows it: once DEL says done it
destroys the sandbox's netns, which would take the pair down anyway. So DEL
unlists the endpoint, writes a marker and answers; a small pool of workers then
deletes the veth (its /32 route goes with it), and only after that releases the
address, so no new pod is given an address that is still routed to the old one.

Any later call for the same host interface (the same pod re-created, a repeated
DEL, a CHECK) waits for that pod's teardown first. A marker left by an agent
that died mid-teardown is finished by :func:`felix.cni_server.recover_after_restart`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)

WORKERS = 4
RETRY_DELAYS_S = (0.2, 1.0, 3.0)


class Teardowns:
    """Deferred teardowns keyed by host interface; one per key at a time."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="teardown")
        self._pending: dict[str, Future[None]] = {}
        self._lock = threading.Lock()

    def submit(self, key: str, work: Callable[[], None]) -> None:
        """Run *work* in the background (retried on failure); calls for *key* wait for it."""
        with self._lock:
            previous = self._pending.get(key)
            self._pending[key] = future = self._pool.submit(self._run, key, previous, work)
        future.add_done_callback(lambda done: self._forget(key, done))

    def wait(self, key: str, timeout: float = 60.0) -> None:
        """Block until no teardown of *key* is pending (a no-op in the common case)."""
        with self._lock:
            future = self._pending.get(key)
        if future is not None:
            future.result(timeout=timeout)

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
        """Finish what is queued (bounded), then stop the workers."""
        if not self.drain(timeout):
            log.warning(
                "stopping with %d teardowns unfinished; restart recovery ends them", self.pending()
            )
        self._pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _run(key: str, previous: Future[None] | None, work: Callable[[], None]) -> None:
        if previous is not None:
            previous.exception()  # keep per-key order; its failure was logged already
        for attempt, delay in enumerate((*RETRY_DELAYS_S, None)):
            try:
                work()
                return
            except Exception:
                if delay is None:
                    log.exception("teardown of %s failed; restart recovery retries it", key)
                    return
                log.warning("teardown of %s failed (attempt %d); retrying", key, attempt + 1)
                time.sleep(delay)

    def _forget(self, key: str, done: Future[None]) -> None:
        with self._lock:
            if self._pending.get(key) is done:
                del self._pending[key]
