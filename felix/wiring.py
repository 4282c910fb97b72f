"""Pod wiring: the veth pair, addresses, routes and sysctls of one pod (netlink seam).

What a wired pod looks like is a pure value (:class:`PodWiring`); :func:`wire`
compares it with the kernel and applies only what is missing, so a repeated
ADD converges instead of failing; :func:`check` reports every difference in
words; :func:`unwire` removes the pair and tolerates anything already gone.

Layout (Calico's, see research/calico.md §1.4)::

    node netns                                pod netns
    caliXXXXXXXXXXX  ee:ee:ee:ee:ee:ee  <==>  eth0  <ip>/32
      proxy_arp=1 forwarding=1                  169.254.1.1 dev eth0 scope link
      route_localnet=1 proxy_delay=0            default via 169.254.1.1 dev eth0
    <ip>/32 dev caliX scope link proto 80

Netlink goes through the one seam, :mod:`kernel`: the fast path for a fresh pod,
pyroute2 ``IPRoute`` for the convergent path and checks. ``node_netns=None``
means the namespace this process runs in (the agent runs in the node's
namespace); tests pass a named namespace instead. A namespace that does not
exist is :class:`kernel.NetnsMissing` (CNI code 3), never created.
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import logging
import os
import socket
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from felix.constants import HOST_IFACE_PREFIX, HOST_VETH_MAC, POD_GATEWAY, TABBY_POD_ROUTE_PROTO
from kernel import NetnsMissing, fast_rtnl, in_netns, iproute, netns_path
from kernel import rtnl as netlink

log = logging.getLogger(__name__)

SCOPE_LINK = 253
MAIN_TABLE = 254
RTM_F_FIB_MATCH = 0x2000
_IFF_UP = 1
_HOST_SYSCTLS = {
    "ipv4/conf/{if}/proxy_arp": "1",
    "ipv4/conf/{if}/forwarding": "1",
    "ipv4/conf/{if}/route_localnet": "1",
    "ipv4/neigh/{if}/proxy_delay": "0",
}
# Read back through netlink (IFLA_AF_SPEC/AF_INET) by check().
_HOST_DEVCONF = {"proxy_arp": 1, "forwarding": 1, "route_localnet": 1}


class WiringError(Exception):
    """The pod cannot be wired as asked; the message says why in words."""


@dataclass(frozen=True)
class PodWiring:
    """The desired wiring of one pod interface."""

    host_ifname: str
    pod_ifname: str
    pod_netns: str
    address: ipaddress.IPv4Address
    mtu: int = 1500


@dataclass(frozen=True)
class Wired:
    """What the kernel ended up with; the CNI result is built from it."""

    host_ifname: str
    host_mac: str
    pod_ifname: str
    pod_mac: str


def host_ifname_for(namespace: str, pod: str) -> str:
    """Calico's deterministic name: the agent and the CNI compute it independently."""
    digest = hashlib.sha1(f"{namespace}.{pod}".encode()).hexdigest()
    return HOST_IFACE_PREFIX + digest[:11]


def host_ifname_for_container(container_id: str) -> str:
    """Name for callers without Kubernetes pod args (Calico: containerID prefix)."""
    return HOST_IFACE_PREFIX + container_id[:11]


def write_host_sysctls(ifname: str, node_netns: str | None = None) -> None:
    """proxy_arp answers the pod's ARP for 169.254.1.1; forwarding lets it route."""
    with in_netns(node_netns):
        for template, value in _HOST_SYSCTLS.items():
            path = "/proc/sys/net/" + template.format(**{"if": ifname})
            with open(path, "w") as fh:
                fh.write(value)


# --- small netlink readers ------------------------------------------------------


def _link(ipr: Any, ifname: str) -> Any | None:
    """One link by name (RTM_GETLINK with IFLA_IFNAME; ``get_links(ifname=)`` dumps all)."""
    try:
        links = ipr.link("get", ifname=ifname)
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.ENOENT):
            return None
        raise
    return links[0] if links else None


def _kind(link: Any) -> str | None:
    info = link.get_attr("IFLA_LINKINFO")
    return info.get_attr("IFLA_INFO_KIND") if info is not None else None


def _is_up(link: Any) -> bool:
    return bool(link["flags"] & _IFF_UP)


def _devconf(link: Any) -> dict[str, int]:
    spec = link.get_attr("IFLA_AF_SPEC")
    inet = spec.get_attr("AF_INET") if spec is not None else None
    return dict(inet) if inet is not None else {}


def _paired(host: Any, pod: Any) -> bool:
    """True when the two links are the two ends of one veth."""
    return (
        _kind(host) == "veth"
        and _kind(pod) == "veth"
        and host.get_attr("IFLA_LINK") == pod["index"]
        and pod.get_attr("IFLA_LINK") == host["index"]
    )


def _v4_addrs(ipr: Any, index: int) -> set[str]:
    return {
        f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.get_addr(family=2, index=index)
    }


def _exact_route(ipr: Any, address: str, plen: int = 32) -> Any | None:
    """The FIB entry for exactly ``address/plen``, found by one lookup, not a dump.

    RTM_F_FIB_MATCH makes the kernel return the matching route itself (with
    its prefix and protocol), so a node with many pods costs the same as one.
    """
    try:
        found = ipr.route("get", dst=address, flags=RTM_F_FIB_MATCH)
    except NetlinkError as exc:
        # EINVAL/EACCES: the best match is a blackhole/prohibit route (the node's
        # own block, installed by BGP), so no exact route exists yet.
        no_route = (
            errno.ENETUNREACH,
            errno.EHOSTUNREACH,
            errno.ENOENT,
            errno.ESRCH,
            errno.EINVAL,
            errno.EACCES,
        )
        if exc.code in no_route:
            return None
        raise
    for route in found:
        if route["dst_len"] == plen and route.get_attr("RTA_DST") == address:
            return route
    return None


def _routes_to(ipr: Any, dst: str, plen: int) -> list[Any]:
    return [
        r
        for r in ipr.get_routes(family=2, table=MAIN_TABLE)
        if r["dst_len"] == plen and (r.get_attr("RTA_DST") or "0.0.0.0") == dst
    ]


# --- wire -------------------------------------------------------------------------


def _create_veth(node: Any, spec: PodWiring) -> None:
    fd = os.open(netns_path(spec.pod_netns), os.O_RDONLY)
    try:
        node.link(
            "add",
            ifname=spec.host_ifname,
            kind="veth",
            address=HOST_VETH_MAC,
            mtu=spec.mtu,
            peer={"ifname": spec.pod_ifname, "net_ns_fd": fd, "mtu": spec.mtu},
        )
    finally:
        os.close(fd)


def _ensure_veth(node: Any, pod: Any, spec: PodWiring) -> None:
    host = _link(node, spec.host_ifname)
    inner = _link(pod, spec.pod_ifname)
    if host is not None and inner is not None and _paired(host, inner):
        return
    if inner is not None:
        raise WiringError(
            f"interface {spec.pod_ifname} already exists in {spec.pod_netns} "
            f"and is not the peer of {spec.host_ifname}"
        )
    if host is not None:
        log.info("replacing stale host veth %s", spec.host_ifname)
        node.link("del", index=host["index"])
    _create_veth(node, spec)


def _ensure_host_link(node: Any, spec: PodWiring, node_netns: str | None) -> int:
    """MAC (retried: the kernel sometimes ignores it), MTU, sysctls, then up."""
    for _ in range(50):
        link = _link(node, spec.host_ifname)
        if link is None:
            raise WiringError(f"host veth {spec.host_ifname} vanished while wiring")
        if link.get_attr("IFLA_ADDRESS") == HOST_VETH_MAC:
            break
        node.link("set", index=link["index"], address=HOST_VETH_MAC)
        time.sleep(0.1)
    else:
        raise WiringError(f"kernel keeps refusing MAC {HOST_VETH_MAC} on {spec.host_ifname}")
    if link.get_attr("IFLA_MTU") != spec.mtu:
        node.link("set", index=link["index"], mtu=spec.mtu)
    write_host_sysctls(spec.host_ifname, node_netns)
    if not _is_up(link):
        node.link("set", index=link["index"], state="up")
    return int(link["index"])


def _ensure_pod_side(pod: Any, spec: PodWiring) -> str:
    link = _link(pod, spec.pod_ifname)
    if link is None:
        raise WiringError(f"{spec.pod_ifname} vanished from {spec.pod_netns} while wiring")
    index = link["index"]
    if link.get_attr("IFLA_MTU") != spec.mtu:
        pod.link("set", index=index, mtu=spec.mtu)
    if not _is_up(link):
        pod.link("set", index=index, state="up")
    want = f"{spec.address}/32"
    have = _v4_addrs(pod, index)
    for addr in have - {want}:
        ip, plen = addr.split("/")
        pod.addr("del", index=index, address=ip, prefixlen=int(plen))
    if want not in have:
        pod.addr("add", index=index, address=str(spec.address), prefixlen=32)
    pod.route("replace", dst=f"{POD_GATEWAY}/32", oif=index, scope=SCOPE_LINK)
    pod.route("replace", dst="0.0.0.0/0", gateway=POD_GATEWAY, oif=index)
    return str(link.get_attr("IFLA_ADDRESS"))


def _ensure_host_route(node: Any, spec: PodWiring, host_index: int) -> None:
    route = _exact_route(node, str(spec.address))
    if route is not None:
        oif = route.get_attr("RTA_OIF")
        if oif != host_index:
            owner = "Tabby" if route["proto"] == TABBY_POD_ROUTE_PROTO else "someone else"
            raise WiringError(
                f"{spec.address}/32 is already routed via ifindex {oif} (by {owner}); "
                "is the address assigned twice?"
            )
    node.route(
        "replace",
        dst=f"{spec.address}/32",
        oif=host_index,
        scope=SCOPE_LINK,
        proto=TABBY_POD_ROUTE_PROTO,
    )


def wire(spec: PodWiring, node_netns: str | None = None) -> Wired:
    """Make the kernel match *spec*; safe to repeat (missing pieces are re-created).

    A fresh pod (the common case) takes the batched fast path; anything already
    there, or any surprise on the way, goes through the convergent path, which
    repairs a half-made pair and names real conflicts.
    """
    try:
        wired = _wire_fresh(spec, node_netns)
    except netlink.NetlinkError as exc:
        log.info("fast wiring of %s stopped (%s); converging", spec.host_ifname, exc)
        wired = None
    if wired is not None:
        return wired
    with iproute(spec.pod_netns) as pod, iproute(node_netns) as node:
        _ensure_veth(node, pod, spec)
        host_index = _ensure_host_link(node, spec, node_netns)
        pod_mac = _ensure_pod_side(pod, spec)
        _ensure_host_route(node, spec, host_index)
    return Wired(spec.host_ifname, HOST_VETH_MAC, spec.pod_ifname, pod_mac)


def wire_host_side(spec: PodWiring, node_netns: str | None = None) -> None:
    """Put back the node's half of an existing veth (MAC, MTU, sysctls, up, the /32).

    For a pod whose sandbox namespace the agent does not know (re-adopted from its
    route after the agent lost its journal): the pod's side cannot be reached, and a
    veth that is gone cannot be made again without it (:class:`WiringError`).
    """
    with iproute(node_netns) as node:
        if _link(node, spec.host_ifname) is None:
            raise WiringError(
                f"host veth {spec.host_ifname} is gone and its pod's namespace is unknown"
            )
        host_index = _ensure_host_link(node, spec, node_netns)
        _ensure_host_route(node, spec, host_index)


def _wire_fresh(spec: PodWiring, node_netns: str | None) -> Wired | None:
    """Wire a pod whose veth does not exist yet in 5 netlink round trips; None: converge.

    The host end is created up with its MAC and MTU (no traffic can flow before
    the pod end is up, after the sysctls); the pod end's link, address and two
    routes go in one batch; the /32 is added exclusively, so an address that is
    already routed elsewhere falls back to the path that explains the conflict.
    """
    with fast_rtnl(node_netns) as node, fast_rtnl(spec.pod_netns) as pod:
        if node.link(spec.host_ifname) is not None:
            return None
        fd = os.open(netns_path(spec.pod_netns), os.O_RDONLY)
        try:
            node.request(
                [netlink.new_veth(spec.host_ifname, HOST_VETH_MAC, spec.mtu, spec.pod_ifname, fd)]
            )
        finally:
            os.close(fd)
        write_host_sysctls(spec.host_ifname, node_netns)
        host, inner = node.link(spec.host_ifname), pod.link(spec.pod_ifname)
        if host is None or inner is None or host.mac != HOST_VETH_MAC:
            return None
        gateway = ipaddress.IPv4Address(POD_GATEWAY)
        pod.request(
            [
                netlink.set_up(inner.index),
                netlink.new_address(inner.index, spec.address),
                netlink.new_route(gateway, 32, inner.index, scope=SCOPE_LINK),
                netlink.new_route(ipaddress.IPv4Address(0), 0, inner.index, gateway=gateway),
            ]
        )
        route = netlink.new_route(
            spec.address,
            32,
            host.index,
            scope=SCOPE_LINK,
            proto=TABBY_POD_ROUTE_PROTO,
            exclusive=True,
        )
        node.request([route])
    return Wired(spec.host_ifname, HOST_VETH_MAC, spec.pod_ifname, inner.mac)


# --- unwire -----------------------------------------------------------------------


def _delete_veth(rtnl: netlink.Rtnl, ifname: str) -> bool:
    """Delete *ifname* if it is a veth (never someone else's interface of that name)."""
    link = rtnl.link(ifname)
    if link is None or link.kind != "veth":
        return False
    try:
        rtnl.request([netlink.del_link(ifname)])
    except netlink.NetlinkError as exc:
        if exc.errno != errno.ENODEV:
            raise
    return True


def unwire(
    pod_ifname: str,
    pod_netns: str | None,
    host_ifname: str | None = None,
    node_netns: str | None = None,
) -> None:
    """Remove the pod's veth; everything already gone counts as done.

    The pod side is deleted inside the pod's namespace (Calico does the same),
    which takes the host end and its route with it. The host end is deleted by
    name only when the caller knows it still belongs to this container
    (*host_ifname*): after a pod is re-created its new sandbox reuses the name.
    """
    if pod_netns:
        with suppress(NetnsMissing), fast_rtnl(pod_netns) as pod:
            _delete_veth(pod, pod_ifname)
    if host_ifname:
        with fast_rtnl(node_netns) as node:
            _delete_veth(node, host_ifname)


# --- check --------------------------------------------------------------------------


def _check_host(node: Any, spec: PodWiring) -> tuple[list[str], Any | None]:
    host = _link(node, spec.host_ifname)
    if host is None:
        return [f"host veth {spec.host_ifname} is missing"], None
    problems = []
    if _kind(host) != "veth":
        problems.append(f"{spec.host_ifname} is a {_kind(host)}, not a veth")
    if host.get_attr("IFLA_ADDRESS") != HOST_VETH_MAC:
        problems.append(f"{spec.host_ifname} MAC is {host.get_attr('IFLA_ADDRESS')}")
    problems += _host_link_problems(spec, host)
    return problems, host


def _host_link_problems(spec: PodWiring, host: Any) -> list[str]:
    """The host veth's state: up, the pod's MTU, the host devconf Tabby sets."""
    problems = []
    if not _is_up(host):
        problems.append(f"{spec.host_ifname} is down")
    if host.get_attr("IFLA_MTU") != spec.mtu:
        problems.append(f"{spec.host_ifname} MTU is {host.get_attr('IFLA_MTU')}, want {spec.mtu}")
    conf = _devconf(host)
    for key, want in _HOST_DEVCONF.items():
        if conf.get(key) != want:
            problems.append(f"{spec.host_ifname} {key}={conf.get(key)}, want {want}")
    return problems


def _check_host_route(node: Any, spec: PodWiring, host_index: int) -> list[str]:
    route = _exact_route(node, str(spec.address))
    if (
        route is not None
        and route.get_attr("RTA_OIF") == host_index
        and route["scope"] == SCOPE_LINK
        and route["proto"] == TABBY_POD_ROUTE_PROTO
    ):
        return []
    return [
        f"host route {spec.address}/32 dev {spec.host_ifname} scope link "
        f"proto {TABBY_POD_ROUTE_PROTO} is missing"
    ]


def _check_pod(pod: Any, spec: PodWiring, host: Any | None) -> list[str]:
    inner = _link(pod, spec.pod_ifname)
    if inner is None:
        return [f"{spec.pod_ifname} is missing in {spec.pod_netns}"]
    problems = []
    if host is not None and not _paired(host, inner):
        problems.append(f"{spec.pod_ifname} is not the peer of {spec.host_ifname}")
    if not _is_up(inner):
        problems.append(f"{spec.pod_ifname} is down")
    if inner.get_attr("IFLA_MTU") != spec.mtu:
        problems.append(f"{spec.pod_ifname} MTU is {inner.get_attr('IFLA_MTU')}, want {spec.mtu}")
    index = inner["index"]
    if f"{spec.address}/32" not in _v4_addrs(pod, index):
        problems.append(f"{spec.pod_ifname} lacks address {spec.address}/32")
    gw = [r for r in _routes_to(pod, POD_GATEWAY, 32) if r.get_attr("RTA_OIF") == index]
    if not any(r["scope"] == SCOPE_LINK for r in gw):
        problems.append(f"pod route {POD_GATEWAY} dev {spec.pod_ifname} scope link is missing")
    default = [
        r
        for r in _routes_to(pod, "0.0.0.0", 0)
        if r.get_attr("RTA_GATEWAY") == POD_GATEWAY and r.get_attr("RTA_OIF") == index
    ]
    if not default:
        problems.append(f"pod default route via {POD_GATEWAY} dev {spec.pod_ifname} is missing")
    return problems


def check(spec: PodWiring, node_netns: str | None = None) -> list[str]:
    """Every way the kernel differs from *spec*, in words; empty means wired."""
    with iproute(node_netns) as node:
        problems, host = _check_host(node, spec)
        if host is not None:
            problems += _check_host_route(node, spec, host["index"])
    try:
        with iproute(spec.pod_netns) as pod:
            problems += _check_pod(pod, spec, host)
    except NetnsMissing:
        problems.append(f"network namespace {spec.pod_netns} does not exist")
    return problems


# --- resync: which pods drifted ------------------------------------------------------


def drifted(specs: list[PodWiring], node_netns: str | None = None) -> dict[str, list[str]]:
    """host veth -> what differs on the node side, for every spec that drifted.

    One link dump and one route dump for the whole node, so a resync costs the
    same few round trips however many pods there are. Only Tabby's own routes
    (protocol :data:`TABBY_POD_ROUTE_PROTO`) count as the pod's route; nothing
    here changes the kernel (:func:`wire` repairs, and is convergent).
    """
    if not specs:
        return {}
    with iproute(node_netns) as node:
        links = {
            link.get_attr("IFLA_IFNAME"): link
            for link in node.get_links()
            if (link.get_attr("IFLA_IFNAME") or "").startswith(HOST_IFACE_PREFIX)
        }
        routes = {
            str(route.get_attr("RTA_DST")): route
            for route in node.get_routes(family=socket.AF_INET, table=MAIN_TABLE)
            if route["proto"] == TABBY_POD_ROUTE_PROTO and route["dst_len"] == 32
        }
    found: dict[str, list[str]] = {}
    for spec in specs:
        problems = _host_drift(spec, links.get(spec.host_ifname), routes.get(str(spec.address)))
        if problems:
            found[spec.host_ifname] = problems
    return found


def _host_drift(spec: PodWiring, link: Any | None, route: Any | None) -> list[str]:
    if link is None or _kind(link) != "veth":
        return [f"host veth {spec.host_ifname} is missing"]
    problems = _host_link_problems(spec, link)
    if route is None or route.get_attr("RTA_OIF") != link["index"]:
        problems.append(f"host route {spec.address}/32 dev {spec.host_ifname} is missing")
    return problems
