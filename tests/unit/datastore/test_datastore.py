"""Datastore semantics that need no apiserver: models, CAS, retries, informer logic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from datastore import kinds
from datastore.client import Datastore, RetriesExhausted
from datastore.errors import AlreadyExists, Conflict, NotFound, Unavailable, error_for
from datastore.informer import Backoff, Handlers, Informer, without_managed_fields
from datastore.memory import MemoryTransport
from datastore.models import IPAMHandle, IPAMHandleSpec, IPPool, IPPoolSpec, Meta


def _pool(name: str = "p", cidr: str = "10.0.0.0/16") -> IPPool:
    return IPPool(metadata=Meta(name=name), spec=IPPoolSpec(cidr=cidr))


def test_models_use_camel_case_on_the_wire_and_keep_explicit_aliases() -> None:
    handle = IPAMHandle(metadata=Meta(name="h"), spec=IPAMHandleSpec(handle_id="net.abc"))
    wire = handle.to_wire()
    assert wire["spec"]["handleID"] == "net.abc"
    assert wire["apiVersion"] == "crd.tabby.dev/v1" and wire["kind"] == "IPAMHandle"
    assert IPAMHandle.from_wire(wire).spec.handle_id == "net.abc"
    assert _pool().to_wire()["spec"]["blockSize"] == 26


def test_resource_paths() -> None:
    assert kinds.IPPOOL.object_path("x") == "/apis/crd.tabby.dev/v1/ippools/x"
    assert kinds.POD.collection_path("ns") == "/api/v1/namespaces/ns/pods"
    assert kinds.POD.collection_path() == "/api/v1/pods"
    with pytest.raises(ValueError, match="namespaced"):
        kinds.POD.object_path("x")


def test_create_get_update_delete_with_compare_and_swap() -> None:
    ds = Datastore(MemoryTransport())
    created = ds.create(_pool())
    with pytest.raises(AlreadyExists):
        ds.create(_pool())
    fresh = ds.get(IPPool, "p")
    fresh.spec.disabled = True
    updated = ds.update(fresh)
    assert updated.resource_version != created.resource_version
    created.spec.nat_outgoing = True
    with pytest.raises(Conflict):
        ds.update(created)  # stale resourceVersion loses
    with pytest.raises(Conflict):
        ds.delete(created)  # stale precondition loses too
    ds.delete(updated)
    with pytest.raises(NotFound):
        ds.get(IPPool, "p")
    assert ds.try_get(IPPool, "p") is None


def test_mutate_retries_conflicts_then_gives_up_with_a_named_error() -> None:
    transport = MemoryTransport()
    ds = Datastore(transport)
    ds.create(_pool())
    conflicts = {"left": 2}

    def conflict_on_put(method: str, path: str) -> None:
        if method == "PUT" and conflicts["left"] > 0:
            conflicts["left"] -= 1
            raise Conflict("injected", 409, "Conflict")

    transport.fault_hook = conflict_on_put

    def disable(pool: IPPool) -> IPPool:
        pool.spec.disabled = True
        return pool

    result = ds.mutate(IPPool, "p", disable)
    assert result is not None and result.spec.disabled and conflicts["left"] == 0

    conflicts["left"] = 100
    with pytest.raises(RetriesExhausted, match="IPPool p"):
        ds.mutate(IPPool, "p", disable, retries=3)


def test_mutate_returning_none_writes_nothing() -> None:
    transport = MemoryTransport()
    ds = Datastore(transport)
    before = ds.create(_pool())
    assert ds.mutate(IPPool, "p", lambda _: None) == ds.get(IPPool, "p")
    assert ds.get(IPPool, "p").resource_version == before.resource_version


def test_error_mapping() -> None:
    assert isinstance(error_for(409, "AlreadyExists", "x"), AlreadyExists)
    assert isinstance(error_for(409, "Conflict", "x"), Conflict)
    assert isinstance(error_for(503, "", "x"), Unavailable)


class ScriptedTransport(MemoryTransport):
    """Lists from memory; watches replay scripted event batches, then end the test."""

    def __init__(self, batches: list[list[dict[str, Any]]]) -> None:
        super().__init__()
        self.batches = batches
        self.watch_versions: list[str] = []

    def watch(self, path: str, query: Any, timeout: float) -> Iterator[dict[str, Any]]:
        self.watch_versions.append(str(query["resourceVersion"]))
        if not self.batches:
            raise Unavailable("script finished")
        yield from self.batches.pop(0)


def _obj(name: str, version: str, cidr: str = "10.0.0.0/16") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}, "spec": {"cidr": cidr}}


def _run(informer: Informer, until: Any) -> None:
    informer.start()
    deadline = 200
    while deadline and not until():
        deadline -= 1
        informer._stop.wait(0.01)
    informer.stop()


def test_informer_relists_on_410_and_reconciles_without_duplicates() -> None:
    transport = ScriptedTransport([])
    ds = Datastore(transport)
    ds.create(_pool("a"))
    ds.create(_pool("b"))
    events: list[tuple[str, str]] = []
    handlers = Handlers(
        on_add=lambda o: events.append(("add", o["metadata"]["name"])),
        on_update=lambda old, new: events.append(("update", new["metadata"]["name"])),
        on_delete=lambda o: events.append(("delete", o["metadata"]["name"])),
    )
    informer = Informer(ds, kinds.IPPOOL, handlers)

    def expire_then_change() -> None:
        # while the informer is "disconnected": b is deleted, c is created
        ds.delete(ds.get(IPPool, "b"))
        ds.create(_pool("c"))

    transport.batches = [
        [{"type": "MODIFIED", "object": _obj("a", "900")}],
        [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "950"}}}],
        [{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}],
    ]
    transport.fault_hook = lambda method, path: None
    original_watch = transport.watch

    def watch_and_mutate(path: str, query: Any, timeout: float) -> Iterator[dict[str, Any]]:
        if len(transport.watch_versions) == 2:
            expire_then_change()
        return original_watch(path, query, timeout)

    transport.watch = watch_and_mutate  # type: ignore[method-assign]
    _run(informer, lambda: informer.stats.relists_on_gone == 1 and informer.stats.lists == 2)

    assert transport.watch_versions[1:3] == ["900", "950"]  # resumed from the last version seen
    assert events.count(("add", "a")) == 1 and events.count(("add", "b")) == 1
    assert ("delete", "b") in events and ("add", "c") in events
    assert set(informer.snapshot()) == {"a", "c"}


def test_informer_callback_errors_do_not_stop_it() -> None:
    transport = ScriptedTransport([[{"type": "ADDED", "object": _obj("x", "5")}]])
    ds = Datastore(transport)

    def boom(obj: dict[str, Any]) -> None:
        raise RuntimeError("handler bug")

    informer = Informer(ds, kinds.IPPOOL, Handlers(on_add=boom))
    _run(informer, lambda: "x" in informer.snapshot())
    assert "x" in informer.snapshot()


def test_informer_transform_shapes_listed_and_watched_objects() -> None:
    managed = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    watched = _obj("x", "5")
    watched["metadata"]["managedFields"] = managed
    transport = ScriptedTransport([[{"type": "ADDED", "object": watched}]])
    ds = Datastore(transport)
    ds.create_raw(kinds.IPPOOL, {**_obj("a", "1"), "apiVersion": "tabby.dev/v1"})
    ds.patch_raw(kinds.IPPOOL, "a", {"metadata": {"managedFields": managed}})
    assert ds.get_raw(kinds.IPPOOL, "a")["metadata"]["managedFields"] == managed
    seen: list[dict[str, Any]] = []
    informer = Informer(
        ds, kinds.IPPOOL, Handlers(on_add=seen.append), transform=without_managed_fields
    )
    _run(informer, lambda: "x" in informer.snapshot())

    assert set(informer.snapshot()) == {"a", "x"}
    for obj in [*informer.snapshot().values(), *seen]:
        assert "managedFields" not in obj["metadata"]
        assert obj["spec"] == {"cidr": "10.0.0.0/16"}
    assert len(seen) == 2
    assert watched["metadata"]["managedFields"] == managed  # the event itself is not changed


class PagingTransport(ScriptedTransport):
    """Serves lists a page at a time, as the apiserver does for ``limit``."""

    def __init__(self) -> None:
        super().__init__([])
        self.pages_served = 0

    def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        body = super().request(method, path, **kw)
        query = kw.get("query") or {}
        if method != "GET" or "limit" not in query or "items" not in body:
            return body
        start = int(query.get("continue") or 0)
        end = start + int(query["limit"])
        self.pages_served += 1
        more = end < len(body["items"])
        body["items"] = body["items"][start:end]
        body["metadata"] = {**body.get("metadata", {}), "continue": str(end) if more else ""}
        return body


def test_the_informer_lists_a_page_at_a_time_and_shapes_each_page() -> None:
    transport = PagingTransport()
    ds = Datastore(transport)
    managed = [{"manager": "kubectl"}]
    for i in range(7):
        ds.create_raw(kinds.IPPOOL, {**_obj(f"p{i}", "1"), "apiVersion": "tabby.dev/v1"})
        ds.patch_raw(kinds.IPPOOL, f"p{i}", {"metadata": {"managedFields": managed}})
    pages = list(ds.list_pages(kinds.IPPOOL, page_size=3))
    assert [len(items) for items, _ in pages] == [3, 3, 1]
    seen: list[str] = []
    informer = Informer(
        ds,
        kinds.IPPOOL,
        Handlers(on_add=lambda o: seen.append(o["metadata"]["name"])),
        transform=without_managed_fields,
        page_size=3,
    )
    served = transport.pages_served
    transport.batches = [[]]  # the watch after the list: nothing happens
    _run(informer, informer.synced.is_set)
    assert transport.pages_served - served == 3
    assert sorted(informer.snapshot()) == sorted(seen) == [f"p{i}" for i in range(7)]
    assert all("managedFields" not in o["metadata"] for o in informer.snapshot().values())


class UnservedTransport(ScriptedTransport):
    """An apiserver without one CRD: its lists and watches answer 404 until served."""

    def __init__(self, plural: str) -> None:
        super().__init__([])
        self.plural = plural
        self.served = False
        self.ready = True  # what /readyz says

    def _check(self, path: str) -> None:
        if not self.served and path.rstrip("/").endswith(self.plural):
            raise NotFound(f"the server could not find the requested resource ({path})", 404)

    def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        if path == "/readyz":
            if not self.ready:
                raise Unavailable("[-]poststarthook/crd-informer-synced failed", 500)
            return {}
        self._check(path)
        return super().request(method, path, **kw)

    def watch(self, path: str, query: Any, timeout: float) -> Iterator[dict[str, Any]]:
        self._check(path)
        self.watch_versions.append(str(query["resourceVersion"]))
        yield from self.batches.pop(0) if self.batches else []


def _cnp(name: str) -> dict[str, Any]:
    kind = kinds.CLUSTERNETWORKPOLICY
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": {"name": name}}


def test_an_optional_kind_without_its_crd_is_synced_empty_and_found_once_installed() -> None:
    transport = UnservedTransport(kinds.CLUSTERNETWORKPOLICY.plural)
    ds = Datastore(transport)
    events: list[tuple[str, str]] = []
    handlers = Handlers(
        on_add=lambda o: events.append(("add", o["metadata"]["name"])),
        on_delete=lambda o: events.append(("delete", o["metadata"]["name"])),
    )
    informer = Informer(
        ds, kinds.CLUSTERNETWORKPOLICY, handlers, optional=True, absent_retry_s=0.01
    ).start()
    try:
        assert informer.wait_synced(2), "an unserved optional kind must count as synced"
        assert informer.snapshot() == {} and not informer.served
        transport.served = True  # the CRD is installed, with one object
        ds.create_raw(kinds.CLUSTERNETWORKPOLICY, _cnp("deny-all"))
        _wait(lambda: informer.served and "deny-all" in informer.snapshot())
        transport.served = False  # the CRD is deleted: its objects go with it
        _wait(lambda: not informer.served and informer.snapshot() == {})
    finally:
        informer.stop()
    assert events == [("add", "deny-all"), ("delete", "deny-all")]


def test_a_404_from_an_apiserver_not_yet_ready_is_retried_not_read_as_none() -> None:
    """Just after its start the apiserver answers 404 for custom resources until its
    CRD informer has synced: an optional kind's objects must not vanish meanwhile."""
    transport = UnservedTransport(kinds.CLUSTERNETWORKPOLICY.plural)
    transport.ready = False
    ds = Datastore(transport)
    transport.served = True
    ds.create_raw(kinds.CLUSTERNETWORKPOLICY, _cnp("deny-all"))
    transport.served = False  # the restarted apiserver's first answers
    informer = Informer(
        ds,
        kinds.CLUSTERNETWORKPOLICY,
        optional=True,
        absent_retry_s=0.01,
        backoff=Backoff(initial=0.01, cap=0.01),
    ).start()
    try:
        assert not informer.wait_synced(0.3), "a 404 before /readyz must not count as none"
        assert informer.stats.errors >= 2 and informer.served
        transport.served = transport.ready = True
        _wait(lambda: "deny-all" in informer.snapshot())
    finally:
        informer.stop()


def test_a_required_kind_that_is_not_served_never_counts_as_synced() -> None:
    transport = UnservedTransport(kinds.IPPOOL.plural)
    informer = Informer(
        Datastore(transport), kinds.IPPOOL, backoff=Backoff(initial=0.01, cap=0.01)
    ).start()
    try:
        assert not informer.wait_synced(0.3)
        assert informer.stats.errors >= 2  # retried, with backoff
    finally:
        informer.stop()


def _wait(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
