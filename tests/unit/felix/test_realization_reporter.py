"""felix.realization: the node's NodePolicyStatus, written when it changed, coalesced."""

from __future__ import annotations

import pytest

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import DatastoreError
from datastore.memory import MemoryTransport
from felix.realization import RealizationReporter
from policy.realization import Version, parse_report

V1 = Version(1, "aaaaaaaa")


def reporter(ds: Datastore, interval: float = 0.0) -> RealizationReporter:
    r = RealizationReporter(ds, "node-a", min_interval=interval, now_iso=lambda: "T")
    r.start()
    return r


def test_the_report_is_created_then_replaced_and_reads_back() -> None:
    ds = Datastore(MemoryTransport())
    r = reporter(ds)
    try:
        r.offer({"np/x/web": V1}, frozenset({"np/x/web"}))
        assert r.flush(5.0)
        stored = parse_report(ds.get_raw(kinds.NODEPOLICYSTATUS, "node-a"))
        assert stored.programmed == {"np/x/web": V1} and stored.applied == {"np/x/web"}
        r.offer({"np/x/web": Version(2, "aaaaaaaa")}, frozenset())
        assert r.flush(5.0)
        stored = parse_report(ds.get_raw(kinds.NODEPOLICYSTATUS, "node-a"))
        assert stored.programmed["np/x/web"].generation == 2 and not stored.applied
        writes = r.writes
        r.offer({"np/x/web": Version(2, "aaaaaaaa")}, frozenset())  # no change: no write
        assert r.flush(5.0) and r.writes == writes
    finally:
        r.stop()


def test_a_burst_of_passes_ends_in_few_writes() -> None:
    ds = Datastore(MemoryTransport())
    r = reporter(ds, interval=0.3)
    try:
        for generation in range(1, 51):
            r.offer({"cnp/deny": Version(generation, "aaaaaaaa")}, frozenset())
        assert r.flush(5.0)
        assert r.writes <= 2  # the first offer may be written alone; the rest once
        stored = parse_report(ds.get_raw(kinds.NODEPOLICYSTATUS, "node-a"))
        assert stored.programmed["cnp/deny"].generation == 50
    finally:
        r.stop()


def test_a_restarted_agent_replaces_the_report_it_left() -> None:
    ds = Datastore(MemoryTransport())
    first = reporter(ds)
    first.offer({"np/x/old": V1}, frozenset())
    assert first.flush(5.0)
    first.stop()
    second = reporter(ds)  # knows no resourceVersion: reads it, then replaces
    try:
        second.offer({"np/x/new": V1}, frozenset())
        assert second.flush(5.0)
        stored = parse_report(ds.get_raw(kinds.NODEPOLICYSTATUS, "node-a"))
        assert set(stored.programmed) == {"np/x/new"}
    finally:
        second.stop()


def test_a_failed_write_is_retried_until_the_apiserver_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("felix.realization.RETRY_S", 0.05)
    transport = MemoryTransport()
    failures = [DatastoreError("apiserver away")] * 3

    def flaky(method: str, path: str) -> None:
        if "nodepolicystatuses" in path and failures:
            raise failures.pop()

    transport.fault_hook = flaky
    outcomes: list[bool] = []
    r = RealizationReporter(
        Datastore(transport), "node-a", min_interval=0.0, on_write=outcomes.append
    )
    r.start()
    try:
        r.offer({"np/x/web": V1}, frozenset())
        assert r.flush(10.0)
        assert not failures and r.writes == 1
        assert outcomes == [False, False, False, True]  # the agent's metric is told each
    finally:
        r.stop()
