"""Concurrent address requests of one node share block writes (group commit).

Every allocation rewrites its block, and the allocator serializes the writes of
one node (a block is one object): with 100 pods starting at once, the 100th ADD
waited for 99 block writes before its own. Here the first caller writes for
itself; the callers that arrive meanwhile queue, and whoever is first in the
queue when the write ends takes all of them to the allocator as one batch
(:meth:`ipam.allocator.IPAMAllocator.auto_assign_each`): one block write for the
whole batch. Each caller gets its own address or its own error.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address

Request = tuple[str, Mapping[str, str]]  # (handle_id, attributes)
AssignEach = Callable[[Sequence[Request]], list[IPv4Address | Exception]]
MAX_BATCH = 64  # a /26 block's size: more would not fit one block write anyway


@dataclass
class _Slot:
    request: Request
    done: bool = False
    address: IPv4Address | None = None
    error: BaseException | None = None

    def finish(self, outcome: IPv4Address | BaseException) -> None:
        if isinstance(outcome, BaseException):
            self.error = outcome
        else:
            self.address = outcome
        self.done = True


class AssignBatcher:
    """``assign()`` is ``assign_each([request])[0]``, with concurrent calls batched."""

    def __init__(self, assign_each: AssignEach, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._assign_each = assign_each
        self._max_batch = max_batch
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # a batch ended: callers look at their slots
        self.queued = threading.Condition(lock)  # a caller queued (for observers: tests)
        self._queue: list[_Slot] = []
        self._busy = False  # a caller is at the allocator with a batch
        self.batches: deque[int] = deque(maxlen=256)  # sizes of the last batches sent

    def assign(self, handle_id: str, attrs: Mapping[str, str]) -> IPv4Address:
        """One address for ``handle_id``; raises what the allocator reported for it."""
        slot = _Slot((handle_id, dict(attrs)))
        with self._cond:
            self._queue.append(slot)
            self.queued.notify_all()  # nobody waits on it in the agent: a no-op there
            while self._busy and not slot.done:
                self._cond.wait()
            if not slot.done:
                self._busy = True
        if not slot.done:
            self._serve_until(slot)
        if slot.error is not None:
            raise slot.error
        assert slot.address is not None
        return slot.address

    def _serve_until(self, mine: _Slot) -> None:
        """Send batches from the head of the queue until ``mine`` is served."""
        try:
            while not mine.done:
                with self._cond:
                    batch = self._queue[: self._max_batch]
                    del self._queue[: len(batch)]
                    self.batches.append(len(batch))
                outcomes = self._send([s.request for s in batch])
                with self._cond:
                    for slot, outcome in zip(batch, outcomes, strict=True):
                        slot.finish(outcome)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _send(self, requests: list[Request]) -> list[IPv4Address | BaseException]:
        try:
            outcomes: list[IPv4Address | BaseException] = list(self._assign_each(requests))
        except BaseException as exc:  # the whole batch failed: each caller sees why
            return [exc] * len(requests)
        if len(outcomes) != len(requests):
            error = RuntimeError(f"allocator answered {len(outcomes)} of {len(requests)}")
            return [error] * len(requests)
        return outcomes
