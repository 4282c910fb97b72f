"""The agent's reconcile loop: events only mark work dirty; one thread does the work.

Watch callbacks call `request(reason)`; requests coalesce, so a burst of pod or
policy changes costs one recalculation. A timer forces a full resync now and then,
so drift in the kernel (a deleted route, a flushed chain) heals by itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from felix.reasons import PERIODIC_RESYNC

log = logging.getLogger(__name__)

SyncFn = Callable[[set[str]], None]


def backoff_s(failures: int, first_s: float = 0.5, cap_s: float = 30.0) -> float:
    """Delay before retry number `failures` (1, 2, ...): doubling from first_s, capped.

    A pass that fails on the same bad input would otherwise rerun at once, forever:
    with it, a stuck pass costs one try per cap_s instead of a core and a log flood.
    """
    return min(cap_s, first_s * 2 ** max(0, min(failures - 1, 16)))


class ReconcileLoop:
    """Runs `sync(reasons)` whenever requested, at most once at a time, plus periodically."""

    def __init__(self, sync: SyncFn, resync_interval_s: float = 60.0, name: str = "reconcile"):
        self._sync = sync
        self._interval = resync_interval_s
        self._name = name
        self._cond = threading.Condition()
        self._reasons: set[str] = set()
        self._later: dict[str, float] = {}  # reason -> when it becomes a request
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.passes = 0
        self.failures = 0
        self.last_error: str | None = None

    def start(self) -> ReconcileLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def request(self, reason: str) -> None:
        with self._cond:
            self._reasons.add(reason)
            self._cond.notify_all()

    def request_after(self, reason: str, delay_s: float) -> None:
        """Ask for a pass in delay_s (a retry that backs off); the earliest ask wins."""
        due = time.monotonic() + max(0.0, delay_s)
        with self._cond:
            self._later[reason] = min(due, self._later.get(reason, due))
            self._cond.notify_all()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        next_resync = time.monotonic() + self._interval
        while True:
            with self._cond:
                while not self._reasons and not self._stop:
                    now = time.monotonic()
                    for reason, due in list(self._later.items()):
                        if due <= now:
                            del self._later[reason]
                            self._reasons.add(reason)
                    if self._reasons:
                        break
                    remaining = next_resync - now
                    if remaining <= 0:
                        self._reasons.add(PERIODIC_RESYNC)
                        break
                    self._cond.wait(min([remaining, *(d - now for d in self._later.values())]))
                if self._stop:
                    return
                reasons, self._reasons = self._reasons, set()
            if PERIODIC_RESYNC in reasons:
                next_resync = time.monotonic() + self._interval
            self._run_once(reasons)

    def _run_once(self, reasons: set[str]) -> None:
        try:
            self._sync(reasons)
            self.last_error = None
        except Exception as exc:  # keep the loop alive; retry soon
            self.failures += 1
            self.last_error = str(exc)
            log.exception("%s pass failed (%s); retrying", self._name, sorted(reasons))
            time.sleep(min(0.1 * 2 ** min(self.failures, 6), 5.0))
            self.request("retry")
        finally:
            self.passes += 1
