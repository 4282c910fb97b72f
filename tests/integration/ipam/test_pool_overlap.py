"""Issue 21, item 5: overlapping IP pools gave one address to two nodes.

Against the real kube-apiserver with what a cluster gets from manifests/: the
IPPool CRD's CEL rules and the ValidatingAdmissionPolicies of
manifests/ippool-admission.yaml (the control plane installs both). First every
bad pool the probe created is refused at admission with a message naming the
clash; then two overlapping pools that got in anyway (admission bypassed, as on a
cluster that had them before) are selected for different nodes and two allocators
take ~70 addresses each: none may go to both nodes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import DatastoreError, Invalid, NotFound
from datastore.models import IPPool, IPPoolSpec, Meta
from ipam.allocator import IPAMAllocator
from ipam.errors import IPAMError
from lab.controlplane import ControlPlane
from tests.integration.ipam.helpers import clean_pool

pytestmark = pytest.mark.integration

ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
OVERLAP_BINDING = "tabby-ippool-no-overlap"
POOL_A = "10.152.0.0/16"
NODE_NAME = "overlap-probe-node"
NODE_SUBNET = "172.30.77.0/24"
NODE_INTERNAL_IP = "192.168.177.9"


def _pool(name: str, cidr: str, block_size: int = 26, selector: str = "all()") -> IPPool:
    spec = IPPoolSpec(cidr=cidr, block_size=block_size, node_selector=selector)
    return IPPool(metadata=Meta(name=name), spec=spec)


def _dry_run(ds: Datastore, pool: IPPool) -> DatastoreError | None:
    """The apiserver's answer to creating pool, without storing it (None: accepted)."""
    try:
        ds.transport.request(
            "POST", kinds.IPPOOL.collection_path(), query={"dryRun": "All"}, body=pool.to_wire()
        )
    except DatastoreError as exc:
        return exc
    return None


def _wait(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Admission reads other objects from the apiserver's informers: give them a moment.

    Returns when check holds or the time is up; the test's own assertions then judge.
    """
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)


@contextlib.contextmanager
def pools(ds: Datastore, *created: IPPool) -> Iterator[list[IPPool]]:
    """Create pools; afterwards delete them and every block, affinity, handle in them."""
    made: list[IPPool] = []
    try:
        for pool in created:
            made.append(ds.create(pool))
        yield made
    finally:
        for pool in created:
            clean_pool(ds, pool.spec.cidr)
            with contextlib.suppress(NotFound):
                ds.delete(ds.get(IPPool, pool.name), check_version=False)


@contextlib.contextmanager
def probe_node(ds: Datastore) -> Iterator[None]:
    """A Node whose subnet (tabby.dev/ipv4-address) and InternalIP pools must avoid."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE_NAME,
            "annotations": {"tabby.dev/ipv4-address": "172.30.77.5/24"},
        },
    }
    ds.create_raw(kinds.NODE, body)
    try:
        status = {"status": {"addresses": [{"type": "InternalIP", "address": NODE_INTERNAL_IP}]}}
        ds.transport.request(
            "PATCH",
            f"/api/v1/nodes/{NODE_NAME}/status",
            body=status,
            content_type="application/merge-patch+json",
        )
        yield
    finally:
        with contextlib.suppress(NotFound):
            ds.transport.request("DELETE", f"/api/v1/nodes/{NODE_NAME}")


@contextlib.contextmanager
def overlap_admission_off(ds: Datastore) -> Iterator[None]:
    """Remove the overlap policy's binding for a while (a cluster without it), then restore."""
    path = f"{ADMISSION_API}/validatingadmissionpolicybindings"
    try:
        binding = ds.transport.request("GET", f"{path}/{OVERLAP_BINDING}")
    except NotFound:
        binding = None  # no such policy at all (today's main): nothing to switch off
    if binding is not None:
        ds.transport.request("DELETE", f"{path}/{OVERLAP_BINDING}")
    try:
        yield
    finally:
        if binding is not None:
            for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
                binding["metadata"].pop(key, None)
            binding.pop("status", None)
            ds.transport.request("POST", path, body=binding)


def test_apiserver_rejects_overlapping_and_reserved_pools(control_plane: ControlPlane) -> None:
    ds = control_plane.datastore()
    same = _pool("overlap-same", POOL_A)
    with pools(ds, _pool("overlap-a", POOL_A)), probe_node(ds):
        _wait(lambda: isinstance(_dry_run(ds, same), Invalid))
        cases = [
            (same, "pool overlap-same (10.152.0.0/16) overlaps pool overlap-a (10.152.0.0/16)"),
            (_pool("overlap-inside", "10.152.8.0/24"), "overlaps pool overlap-a"),
            (_pool("overlap-around", "10.128.0.0/9"), "overlaps pool overlap-a"),
            (_pool("overlap-lo", "127.0.0.0/8"), "loopback range 127.0.0.0/8"),
            (_pool("overlap-lo16", "127.9.0.0/16"), "loopback range 127.0.0.0/8"),
            (_pool("overlap-mcast", "224.0.0.0/4"), "multicast range 224.0.0.0/4"),
            (_pool("overlap-mcast24", "239.1.2.0/24"), "multicast range 224.0.0.0/4"),
            (_pool("overlap-bcast", "255.255.255.255/32", 32), "broadcast"),
            (_pool("overlap-zero", "0.0.0.0/8", 20), "0.0.0.0/8"),
            (_pool("overlap-ll", "169.254.0.0/16"), "link-local range 169.254.0.0/16"),
            (_pool("overlap-wide", "32.0.0.0/3"), "/8 or longer"),
            (_pool("overlap-svc", "10.96.0.0/16"), "overlaps the Service range 10.96.0.0/16"),
            (_pool("overlap-svc24", "10.96.200.0/24"), "overlaps the Service range"),
            (
                _pool("overlap-node", "172.30.0.0/16"),
                f"overlaps the subnet {NODE_SUBNET} of node {NODE_NAME}",
            ),
            (
                _pool("overlap-nodeip", "192.168.177.0/24"),
                f"holds {NODE_INTERNAL_IP}, the InternalIP of node {NODE_NAME}",
            ),
        ]
        wrong: list[str] = []
        for pool, message in cases:
            try:
                ds.create(pool)
            except Invalid as exc:
                if message not in str(exc):
                    wrong.append(f"{pool.spec.cidr} rejected without {message!r}: {exc}")
            else:
                ds.delete(ds.get(IPPool, pool.name), check_version=False)
                wrong.append(f"{pool.spec.cidr} accepted ({message})")
        assert not wrong, "\n".join(wrong)
        with pools(ds, _pool("overlap-apart", "10.153.0.0/16")) as [apart]:
            assert apart.resource_version  # a pool clear of everything still gets in


def test_overlapping_pools_that_got_in_never_give_an_address_twice(
    control_plane: ControlPlane,
) -> None:
    """The probe's scenario: pool A for zone a, a pool over the same range for zone b.

    Different block sizes, so the two nodes' blocks have different names and nothing
    but the pools' overlap stands between them (70 + 70 > 128: on today's main at least
    12 addresses went to both nodes).
    """
    ds = control_plane.datastore()
    a = _pool("overlap-zone-a", "10.154.0.0/25", 26, "zone == 'a'")
    b = _pool("overlap-zone-b", "10.154.0.0/25", 28, "zone == 'b'")
    with pools(ds, a):
        with overlap_admission_off(ds):
            _wait(lambda: _dry_run(ds, b) is None)
            ds.create(b)  # newer than a, or of the same second: then older by name is a
        _wait(lambda: isinstance(_dry_run(ds, _pool("x", "10.154.0.0/26")), Invalid))
        try:
            node_a = IPAMAllocator(ds, "overlap-node-a", node_labels={"zone": "a"})
            node_b = IPAMAllocator(ds, "overlap-node-b", node_labels={"zone": "b"})
            got: dict[str, list[str]] = {"a": [], "b": []}
            errors: dict[str, list[str]] = {"a": [], "b": []}
            for i in range(70):
                for zone, alloc in (("a", node_a), ("b", node_b)):
                    try:
                        got[zone] += [str(ip) for ip in alloc.auto_assign(f"ovl-{zone}-{i}")]
                    except IPAMError as exc:
                        errors[zone].append(str(exc))
            both = sorted(set(got["a"]) & set(got["b"]))
            assert both == [], f"{len(both)} addresses given to both nodes: {both}"
            assert len(got["a"]) == 70 and not errors["a"], errors["a"][:1]
            assert got["b"] == [] and len(errors["b"]) == 70
            assert (
                "node overlap-node-b may not use any IP pool: pool overlap-zone-b "
                "(10.154.0.0/25) overlaps pool overlap-zone-a (10.154.0.0/25), which is older"
            ) in errors["b"][0]
            assert "delete overlap-zone-b" in errors["b"][0]
        finally:
            clean_pool(ds, b.spec.cidr)
            with contextlib.suppress(NotFound):
                ds.delete(ds.get(IPPool, b.name), check_version=False)
