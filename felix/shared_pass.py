"""Concurrent ADDs share dataplane passes instead of queueing for one each.

An ADD answers only once its pod's policy is programmed, so it waits for a pass that
began after its endpoint was registered. A pass reads every registered endpoint, so
one pass serves every ADD that registered before it began: with 100 ADDs at once,
the first runs a pass for itself, and the ones that arrive meanwhile wait for it to
end and share the next one, instead of running 100 passes one after another (group
commit, as databases do for their log).

A failed pass fails only the callers it was run for; each caller still waiting runs
(or shares) a pass of its own next, so an ADD never succeeds on a pass that failed,
and never fails for a pass that began before it asked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class SharedPass:
    """``run_covering()`` returns once a successful run of ``run`` began after the call."""

    def __init__(self, run: Callable[[], None]) -> None:
        self._run = run
        self._cond = threading.Condition()
        self._asked = 0  # tickets handed out, in order of asking
        self._covered = 0  # every ticket up to this one was served by a successful pass
        self._running = False
        self.passes = 0  # passes run (for tests and metrics)

    def run_covering(self) -> None:
        """Run a pass, or wait for one that covers this call; raise what our pass raised."""
        with self._cond:
            self._asked += 1
            ticket = self._asked
            while self._running and self._covered < ticket:
                self._cond.wait()
            if self._covered >= ticket:
                return  # a pass that began after we asked has succeeded
            self._running = True
            covers = self._asked  # everyone who asked so far is in this pass
        ok = False
        try:
            self._run()
            ok = True
        finally:
            with self._cond:
                self._running = False
                self.passes += 1
                if ok:
                    self._covered = max(self._covered, covers)
                self._cond.notify_all()
