"""Recovery after a restart: undo unanswered ADDs, re-adopt recorded endpoints whose
owner is alive, free the rest and delete ``cali`` veths nobody owns."""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from pyroute2.netlink.exceptions import NetlinkError

from cni.vocabulary import ANNOTATION_POD_IP
from felix import wiring
from felix.cni_server.endpoints import Endpoint, Holding, PodKey
from felix.cni_server.handlers import CNIHandlers
from felix.cni_server.journal import PendingAdd, PendingDel
from felix.constants import HOST_IFACE_PREFIX, TABBY_POD_ROUTE_PROTO
from kernel import iproute, netns_exists

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What :func:`recover_after_restart` found and did (logged; tests read it)."""

    rolled_back: list[str] = field(default_factory=list)  # handles of unanswered ADDs
    released: list[str] = field(default_factory=list)  # handles with no routed veth
    kept: list[str] = field(default_factory=list)  # handles of wired pods
    removed_links: list[str] = field(default_factory=list)  # orphan cali veths
    adopted: list[str] = field(default_factory=list)  # recorded endpoints re-adopted
    adopted_unrecorded: list[str] = field(default_factory=list)  # from their routes
    repaired: list[str] = field(default_factory=list)  # host veths whose wiring drifted
    errors: list[str] = field(default_factory=list)


def _pod_routes(node_netns: str | None) -> tuple[dict[str, str], dict[str, int]]:
    """(address -> cali veth it is routed through, every cali veth -> its MTU) in the node.

    Only Tabby's own routes count (protocol 80, /32, out of a ``cali`` veth):
    wiring installs that route last, so its presence means ``wire`` finished.
    """
    routed: dict[str, str] = {}
    with iproute(node_netns) as ipr:
        links = {
            link["index"]: (link.get_attr("IFLA_IFNAME"), int(link.get_attr("IFLA_MTU") or 0))
            for link in ipr.get_links()
            if (link.get_attr("IFLA_IFNAME") or "").startswith(HOST_IFACE_PREFIX)
            and wiring._kind(link) == "veth"
        }
        for route in ipr.get_routes(family=socket.AF_INET, table=wiring.MAIN_TABLE):
            oif = route.get_attr("RTA_OIF")
            if route["proto"] == TABBY_POD_ROUTE_PROTO and route["dst_len"] == 32 and oif in links:
                routed[str(route.get_attr("RTA_DST"))] = links[oif][0]
    return routed, dict(links.values())


def unrecorded_endpoint(handle_id: str, held: Holding, host: str, mtu: int) -> Endpoint:
    """The endpoint of a wired pod the journal has no record of (the agent lost its run
    dir, or wired it before records existed), from its IPAM handle and its route.

    The handle is ``<network>.<containerID>`` (split at the first dot: container IDs
    are hex). Its sandbox's namespace is not known (``netns`` empty): DEL and GC
    remove its host veth, and resync repairs only the node's side
    (:func:`felix.wiring.wire_host_side`).
    """
    network, _, container_id = handle_id.partition(".")
    return Endpoint(
        network=network,
        container_id=container_id,
        ifname=held.attrs.get("ifname") or "eth0",
        netns="",
        host_ifname=host,
        address=held.address,
        mtu=mtu,
        namespace=held.attrs.get("namespace") or None,
        pod=held.attrs.get("pod") or None,
    )


def _undo_pending(handlers: CNIHandlers, node_netns: str | None, report: RecoveryReport) -> None:
    """Roll back every ADD the dead agent never answered, finish every DEL it answered.

    An unanswered ADD's caller saw it fail. Deleting the pod side in the
    sandbox's netns takes the host end and its route with it (a veth pair is
    created in one netlink call, so there is no half pair); a netns that is
    gone took the pair with it. An answered DEL whose teardown was cut short
    names its host veth, which no newer sandbox can have taken: ADDs for that
    host interface wait for its teardown. Either way the Pod's podIP
    annotation is cleared as a DEL would (the annotator skips it when a newer
    sandbox owns the Pod), so no peer keeps the released address in its policy.
    """
    if handlers.journal is None:
        return
    entries: list[PendingAdd] = [*handlers.journal.pending(), *handlers.journal.pending_deletes()]
    for entry in entries:
        host = entry.host_ifname if isinstance(entry, PendingDel) else None
        try:
            wiring.unwire(entry.ifname, entry.netns or None, host or None, node_netns)
            handlers.allocator.release(entry.handle_id)
            if entry.namespace and entry.pod:
                key = PodKey(entry.namespace, entry.pod, None, entry.container_id)
                handlers.annotate(key, {ANNOTATION_POD_IP: ""})
            handlers.journal.forget(entry)
            report.rolled_back.append(entry.handle_id)
        except Exception as exc:
            report.errors.append(f"roll back {entry.handle_id}: {exc}")


def _delete_link(node_netns: str | None, ifname: str) -> None:
    with iproute(node_netns) as ipr:
        try:
            ipr.link("del", ifname=ifname)
        except NetlinkError as exc:
            if exc.code != errno.ENODEV:
                raise


# Whether an endpoint's Pod still exists: False when the apiserver has no Pod of that
# namespace/name (or one with another UID), None when it cannot be told.
OwnerAlive = Callable[[Endpoint], "bool | None"]


def _adopt_recorded(
    handlers: CNIHandlers,
    netns: str | None,
    owner_alive: OwnerAlive | None,
    report: RecoveryReport,
) -> tuple[set[str], set[str]]:
    """Re-adopt every recorded attachment whose owner is alive; undo the others.

    Kept: the sandbox netns is still there and its Pod is not known to be gone.
    Whether the pod's route or veth is still in the kernel does not matter (a
    deleted route is drift, repaired right after). Returns (handles, host veths)
    kept.
    """
    assert handlers.journal is not None
    undone = set(report.rolled_back)
    kept: list[Endpoint] = []
    dropped: list[Endpoint] = []
    for ep in handlers.journal.endpoints():
        if ep.handle_id in undone:
            handlers.journal.drop(ep.network, ep.container_id, ep.ifname)
        elif netns_exists(ep.netns) and (owner_alive is None or owner_alive(ep) is not False):
            kept.append(ep)
        else:
            dropped.append(ep)
    kept_links = {ep.host_ifname for ep in kept}
    for ep in kept:
        handlers.endpoints.add(ep)
        report.adopted.append(ep.handle_id)
    for ep in dropped:
        host = None if ep.host_ifname in kept_links else ep.host_ifname
        try:
            pod_netns = ep.netns if netns_exists(ep.netns) else None
            wiring.unwire(ep.ifname, pod_netns, host, netns)
            handlers.allocator.release(ep.handle_id)
            if ep.namespace and ep.pod:
                key = PodKey(ep.namespace, ep.pod, ep.pod_uid, ep.container_id)
                handlers.annotate(key, {ANNOTATION_POD_IP: ""})
            handlers.journal.drop(ep.network, ep.container_id, ep.ifname)
            report.released.append(ep.handle_id)
        except Exception as exc:
            report.errors.append(f"endpoint {ep.handle_id[:64]}: {exc}")
    return {ep.handle_id for ep in kept}, kept_links


def _adopt_routed(
    handlers: CNIHandlers,
    kept_handles: set[str],
    routed: dict[str, str],
    links: dict[str, int],
    owners: set[str],
    report: RecoveryReport,
) -> None:
    """Handles of this node with no record: kept and put in the endpoint table when
    their address is routed through a ``cali`` veth (the pod is wired), else released.
    Adds the veths kept to *owners*."""
    released = set(report.released)
    try:
        held = handlers.allocator.allocations()
    except Exception as exc:
        report.errors.append(f"allocations: {exc}")
        return
    for handle_id, holding in sorted(held.items()):
        if handle_id in kept_handles:
            report.kept.append(handle_id)
            continue
        if handle_id in released:
            continue
        host = routed.get(str(holding.address))
        if host is None:
            try:
                handlers.allocator.release(handle_id)
                report.released.append(handle_id)
            except Exception as exc:
                report.errors.append(f"handle {handle_id}: {exc}")
            continue
        owners.add(host)
        report.kept.append(handle_id)
        if handlers.endpoints.owner_of(host) is None:
            handlers.endpoints.add(unrecorded_endpoint(handle_id, holding, host, links[host]))
            report.adopted_unrecorded.append(handle_id)


def recover_after_restart(
    handlers: CNIHandlers,
    node_netns: str | None = None,
    owner_alive: OwnerAlive | None = None,
) -> RecoveryReport:
    """Make the node consistent again after the agent died; run before serving CNI.

    1. ADDs marked in the journal are undone (wiring and address).
    2. Every recorded attachment (:meth:`AddJournal.record`) is decided by its
       owner: kept and put back in the endpoint table (so CHECK, DEL and resync
       know it) while its sandbox netns exists and its Pod is not gone
       (*owner_alive*); otherwise its veth and address are freed as a DEL would.
    3. Handles of **this node** with no record (the journal was lost, or the pod
       was wired before records existed) are kept when their address is routed
       through a ``cali`` veth, and their pod goes into the endpoint table
       (:func:`unrecorded_endpoint`: its policy is programmed again, DEL and GC
       find it); a handle with no routed address is released.
    4. Every ``cali`` veth no kept attachment owns is deleted.
    5. Kept attachments whose route, sysctls or veth drifted are repaired.

    A pod's route being gone never costs it its address or veth. Errors are
    collected, not raised: a node that cannot be fully cleaned must still serve
    its healthy pods.
    """
    netns = node_netns if node_netns is not None else handlers.node_netns
    report = RecoveryReport()
    _undo_pending(handlers, netns, report)
    kept_handles: set[str] = set()
    owners: set[str] = set()
    if handlers.journal is not None:
        kept_handles, owners = _adopt_recorded(handlers, netns, owner_alive, report)
    routed, links = _pod_routes(netns)
    _adopt_routed(handlers, kept_handles, routed, links, owners, report)
    for ifname in sorted(links.keys() - owners):
        try:
            _delete_link(netns, ifname)
            report.removed_links.append(ifname)
        except Exception as exc:
            report.errors.append(f"veth {ifname}: {exc}")
    try:
        report.repaired = handlers.repair()
    except Exception as exc:
        report.errors.append(f"repair: {exc}")
    log.info(
        "recovery after restart: %d ADDs rolled back, %d endpoints re-adopted "
        "(%d of them from their routes, with no record), "
        "%d handles released, %d kept, %d orphan veths removed, %d repaired, %d errors",
        len(report.rolled_back),
        len(report.adopted) + len(report.adopted_unrecorded),
        len(report.adopted_unrecorded),
        len(report.released),
        len(report.kept),
        len(report.removed_links),
        len(report.repaired),
        len(report.errors),
        extra={"recovery": report.__dict__},
    )
    return report
