"""DEL answers first and tears down after (felix.teardown): order, waits, retries, markers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.shim import ERR_TRY_AGAIN_LATER
from felix import teardown, wiring
from felix.cni_server import AddJournal, CNIHandlers, RecoveryReport, recovery
from felix.pool_allocator import PoolAllocator
from tests.unit.cni.test_cni_server import NET, FakeKernel, Recorder, code_of, req

HOST = wiring.host_ifname_for("default", "nginx")


class SlowKernel(FakeKernel):
    """unwire blocks until released; every call is logged in order."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.log: list[str] = []
        self.failures = 0

    def wire(self, spec: wiring.PodWiring, node_netns: str | None = None) -> wiring.Wired:
        self.log.append(f"wire {spec.host_ifname}")
        return super().wire(spec, node_netns)

    def unwire(
        self,
        pod_ifname: str,
        pod_netns: str | None,
        host_ifname: str | None = None,
        node_netns: str | None = None,
    ) -> None:
        assert self.release.wait(10), "test never released the teardown"
        if self.failures:
            self.failures -= 1
            raise OSError("netlink busy")
        self.log.append(f"unwire {host_ifname}")
        super().unwire(pod_ifname, pod_netns, host_ifname, node_netns)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> SlowKernel:
    fake = SlowKernel()
    monkeypatch.setattr(wiring, "wire", fake.wire)
    monkeypatch.setattr(wiring, "unwire", fake.unwire)
    monkeypatch.setattr(teardown, "RETRY_DELAYS_S", (0.01, 0.01))
    return fake


@pytest.fixture
def handlers(kernel: SlowKernel, tmp_path: Path) -> Iterator[CNIHandlers]:
    rec = Recorder()
    h = CNIHandlers(
        PoolAllocator("10.65.0.0/24"),
        annotate=rec.annotate,
        on_endpoint_removed=rec.removed.append,
        journal=AddJournal(tmp_path / "journal"),
    )
    h.set_synced()
    yield h
    kernel.release.set()
    h.close()


def test_del_answers_before_the_veth_goes_and_releases_the_address_after(
    handlers: CNIHandlers, kernel: SlowKernel
) -> None:
    handlers.handle(req())
    assert handlers.handle(req("DEL")) is None  # answered while unwire is blocked
    assert handlers.endpoints.all() == []
    assert handlers.allocator.handles() == {f"{NET}.c1"}  # still routed: not reusable yet
    kernel.release.set()
    assert handlers.teardowns.drain()
    assert kernel.log[-1] == f"unwire {HOST}"
    assert handlers.allocator.handles() == set()


def test_the_same_pod_added_again_waits_for_its_teardown(
    handlers: CNIHandlers, kernel: SlowKernel
) -> None:
    handlers.handle(req("ADD", "old"))
    handlers.handle(req("DEL", "old"))
    again = threading.Thread(target=handlers.handle, args=(req("ADD", "new"),))
    again.start()
    kernel.release.set()
    again.join(10)
    assert kernel.log == [f"wire {HOST}", f"unwire {HOST}", f"wire {HOST}"]
    assert handlers.allocator.handles() == {f"{NET}.new"}


def test_a_failed_teardown_is_retried(handlers: CNIHandlers, kernel: SlowKernel) -> None:
    handlers.handle(req())
    kernel.failures = 1
    handlers.handle(req("DEL"))
    kernel.release.set()
    assert handlers.teardowns.drain()
    assert kernel.log[-1] == f"unwire {HOST}"
    assert handlers.allocator.handles() == set()


def test_a_teardown_failing_past_its_delays_keeps_trying_until_it_succeeds(
    handlers: CNIHandlers, kernel: SlowKernel
) -> None:
    """The runtime was told DEL is done and never sends it again: giving up would
    hold the address until the agent restarts (it did after 3 tries before)."""
    assert handlers.journal is not None
    handlers.handle(req())
    kernel.failures = 6  # the fixture's delays are 2: four more on the last one
    handlers.handle(req("DEL"))
    kernel.release.set()
    assert handlers.teardowns.drain()
    assert kernel.failures == 0 and kernel.log[-1] == f"unwire {HOST}"
    assert handlers.allocator.handles() == set()
    assert handlers.journal.pending_deletes() == []


def test_the_same_pod_is_told_to_try_again_while_its_teardown_keeps_failing(
    handlers: CNIHandlers, kernel: SlowKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(teardown, "WAIT_S", 0.2)
    handlers.handle(req("ADD", "old"))
    kernel.failures = 10**6
    handlers.handle(req("DEL", "old"))
    kernel.release.set()
    assert code_of(handlers, req("ADD", "new")) == ERR_TRY_AGAIN_LATER
    assert handlers.allocator.handles() == {f"{NET}.old"}  # still routed: kept
    kernel.failures = 0
    assert handlers.teardowns.drain()
    handlers.handle(req("ADD", "new"))
    assert handlers.allocator.handles() == {f"{NET}.new"}


def test_stopping_ends_the_retries_and_leaves_the_marker_for_the_next_start(
    handlers: CNIHandlers, kernel: SlowKernel
) -> None:
    assert handlers.journal is not None
    handlers.handle(req())
    kernel.failures = 10**6
    handlers.handle(req("DEL"))
    kernel.release.set()
    handlers.teardowns.close(timeout=0.1)
    left = kernel.failures
    time.sleep(0.1)  # several retry delays of the fixture's 0.01 s: none may fire
    assert kernel.failures == left
    assert [m.container_id for m in handlers.journal.pending_deletes()] == ["c1"]


def test_a_marker_stands_until_the_teardown_is_done(
    handlers: CNIHandlers, kernel: SlowKernel
) -> None:
    assert handlers.journal is not None
    handlers.handle(req())
    handlers.handle(req("DEL"))
    (marker,) = handlers.journal.pending_deletes()
    assert (marker.container_id, marker.host_ifname) == ("c1", HOST)
    kernel.release.set()
    assert handlers.teardowns.drain()
    assert handlers.journal.pending_deletes() == []


def test_recovery_finishes_a_teardown_the_dead_agent_left(
    kernel: SlowKernel, tmp_path: Path
) -> None:
    journal = AddJournal(tmp_path / "journal")
    allocator = PoolAllocator("10.65.0.0/24")
    allocator.assign(f"{NET}.c1", {})
    journal.begin_delete(req("DEL"), HOST)  # what a DEL wrote before the agent died
    restarted = CNIHandlers(allocator, journal=journal)
    kernel.release.set()
    report = RecoveryReport()
    recovery._undo_pending(restarted, None, report)
    assert report.rolled_back == [f"{NET}.c1"] and report.errors == []
    assert kernel.log == [f"unwire {HOST}"]
    assert allocator.handles() == set()
    assert journal.pending_deletes() == []
    restarted.close()
