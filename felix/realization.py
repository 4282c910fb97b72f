"""This node's NodePolicyStatus: the policy versions its dataplane has programmed.

The policy manager offers the report after each pass that programmed policy; a
thread writes it when it changed, at most once per ``min_interval`` (a burst of passes
ends in one write: one object per node, never one write per policy). The agent is the
only writer of its node's object, so it replaces it with the resourceVersion of its
own last write (a conflict, e.g. after a restart, re-reads it once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from datastore import kinds, timestamps
from datastore.client import Datastore
from datastore.errors import Conflict, NotFound
from policy.realization import NodeReport, Version

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.25  # between two writes of the node's report
RETRY_S = 1.0  # after a failed write, doubling up to RETRY_MAX_S while failures last
RETRY_MAX_S = 60.0


class RealizationReporter:
    """Publishes the node's :class:`policy.realization.NodeReport`, coalesced."""

    def __init__(
        self,
        datastore: Datastore,
        node: str,
        *,
        min_interval: float = MIN_INTERVAL_S,
        now_iso: Callable[[], str] = timestamps.now_iso,
        on_write: Callable[[bool], None] = lambda _ok: None,
    ) -> None:
        self.datastore = datastore
        self.node = node
        self.min_interval = min_interval
        self._now_iso = now_iso
        self._on_write = on_write  # told each write's outcome (the agent's metric)
        self._cond = threading.Condition()
        self._offered: tuple[dict[str, Version], frozenset[str]] | None = None
        self._written: tuple[dict[str, Version], frozenset[str]] | None = None
        self._resource_version: str | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.writes = 0  # for tests and the log

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="policy-status", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def offer(self, programmed: Mapping[str, Version], applied: frozenset[str]) -> None:
        """The state a pass has just programmed (cheap: the write happens elsewhere)."""
        with self._cond:
            self._offered = (dict(programmed), applied)
            if self._offered != self._written:
                self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until what was offered is written (tests); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._offered != self._written:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # -- the writer thread ------------------------------------------------------------
    def _run(self) -> None:
        last = 0.0
        retry = RETRY_S
        while True:
            with self._cond:
                while not self._stopping and self._offered == self._written:
                    self._cond.wait()
                if self._stopping:
                    return
            pause = last + self.min_interval - time.monotonic()
            if pause > 0:  # let the passes of a burst pile up into one write
                time.sleep(pause)
            with self._cond:
                state = self._offered
            assert state is not None
            try:
                self._write(state)
                self._on_write(True)
            except Exception as exc:  # the apiserver is away, or the CRD is missing
                self._on_write(False)
                log.warning("could not publish the node's policy status (retry in %.0f s): %s",
                            retry, exc)  # fmt: skip
                self._sleep_unless_stopping(retry)
                retry = min(retry * 2, RETRY_MAX_S)
                continue
            finally:
                last = time.monotonic()
            retry = RETRY_S
            with self._cond:
                self._written = state
                self._cond.notify_all()

    def _sleep_unless_stopping(self, seconds: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._stopping, seconds)

    def _write(self, state: tuple[dict[str, Version], frozenset[str]]) -> None:
        report = NodeReport(self.node, state[0], state[1], self._now_iso())
        body: dict[str, Any] = {
            "apiVersion": kinds.NODEPOLICYSTATUS.api_version,
            "kind": kinds.NODEPOLICYSTATUS.kind,
            "metadata": {"name": self.node},
            "status": report.to_status(),
        }
        for _ in range(2):
            if self._resource_version is None:
                self._resource_version = self._current_version()
            if self._resource_version is None:
                stored = self.datastore.create_raw(kinds.NODEPOLICYSTATUS, body)
            else:
                body["metadata"]["resourceVersion"] = self._resource_version
                try:
                    stored = self.datastore.replace_raw(kinds.NODEPOLICYSTATUS, body)
                except (Conflict, NotFound):
                    self._resource_version = None  # re-read once, then write again
                    body["metadata"].pop("resourceVersion", None)
                    continue
            self._resource_version = stored["metadata"]["resourceVersion"]
            self.writes += 1
            return
        raise Conflict(f"NodePolicyStatus {self.node} changed under its writer twice")

    def _current_version(self) -> str | None:
        try:
            raw = self.datastore.get_raw(kinds.NODEPOLICYSTATUS, self.node)
        except NotFound:
            return None
        return str(raw["metadata"]["resourceVersion"])
