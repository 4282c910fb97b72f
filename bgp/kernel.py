"""The one seam between BGP and the kernel's routes (pyroute2).

The manager owns exactly the routes in the main table whose protocol is its own
(`PROTO_BGP`, 81): it reads them, diffs them against the desired set and applies
the difference. A route with any other protocol is never deleted or replaced,
not even when it has the destination we want (that is reported as a conflict):
pod routes, kernel routes, kube-proxy's and the host's own stay untouched.
`apply()` is also the resync: called on a timer it repairs drift (a deleted or
changed route) because it always starts from a fresh kernel dump.

Neighbour and FDB entries for VXLAN live on Tabby's own VXLAN device, so every
permanent entry there is ours and may be replaced or removed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import kernel
from bgp.routes import PROTO_BGP, FdbEntry, KernelRoute, NeighEntry

log = logging.getLogger(__name__)

MAIN_TABLE = 254
RTNH_F_ONLINK = 4
NUD_PERMANENT = 0x80
NTF_SELF = 0x02
_KIND_BY_TYPE = {1: "unicast", 6: "blackhole", 7: "unreachable"}
_TYPE_BY_KIND = {v: k for k, v in _KIND_BY_TYPE.items()}


class Netlink(Protocol):
    """The part of pyroute2's IPRoute the manager uses (so tests can see the calls)."""

    def route(self, command: str, **kwargs: Any) -> Any: ...
    def neigh(self, command: str, **kwargs: Any) -> Any: ...
    def fdb(self, command: str, **kwargs: Any) -> Any: ...
    def get_links(self, *args: Any, **kwargs: Any) -> Any: ...
    def close(self) -> None: ...


def iproute_factory(netns: str | None = None) -> Callable[[], Netlink]:
    """A factory of IPRoute handles, in a named network namespace or the current one
    (the one netlink seam, :mod:`kernel`: no helper process per handle)."""
    return kernel.iproute_factory(netns)


@dataclass
class ApplyResult:
    """What one apply() changed; `errors` holds routes the kernel refused."""

    added: list[KernelRoute] = field(default_factory=list)
    removed: list[KernelRoute] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)


class RouteManager:
    """Desired routes in, kernel brought in line; only routes with our protocol touched."""

    def __init__(
        self,
        netlink: Callable[[], Netlink],
        proto: int = PROTO_BGP,
        table: int = MAIN_TABLE,
    ) -> None:
        self._netlink = netlink
        self.proto = proto
        self.table = table
        self.desired: dict[ipaddress.IPv4Network, KernelRoute] = {}
        # destinations this run wanted at some point: ours to delete even before BGP
        # has synced (what a previous run left is only pruned once it has)
        self.explained: set[ipaddress.IPv4Network] = set()

    def set_desired(self, routes: Iterable[KernelRoute]) -> None:
        self.desired = {r.dst: _with_proto(r, self.proto) for r in routes}
        self.explained.update(self.desired)

    def apply(self, prune: bool = True) -> ApplyResult:
        """Diff the desired routes against a fresh kernel dump and apply the difference.

        `prune=False` adds and fixes, and deletes only routes this run itself wanted
        before (a withdrawn prefix, a peer gone down): right after a restart, routes
        learned by the previous run stay until BGP has caught up.
        """
        result = ApplyResult()
        with self._open() as ipr:
            names = _link_names(ipr)
            ours, others = self._read(ipr, names)
            for dst, current in sorted(ours.items()):
                if dst not in self.desired and (prune or dst in self.explained):
                    self._delete(ipr, current, names, result)
            for dst, route in sorted(self.desired.items()):
                if dst in others:
                    result.conflicts.append(
                        f"{route}: {dst} already has a route of proto {others[dst]}"
                    )
                elif ours.get(dst) != route:
                    self._replace(ipr, route, names, result)
        self.explained.difference_update(r.dst for r in result.removed)
        return result

    def read(self) -> list[KernelRoute]:
        """The routes of our protocol currently in the kernel (for status and tests)."""
        with self._open() as ipr:
            ours, _ = self._read(ipr, _link_names(ipr))
        return sorted(ours.values())

    @contextlib.contextmanager
    def _open(self) -> Iterator[Netlink]:
        ipr = self._netlink()
        try:
            yield ipr
        finally:
            ipr.close()

    def _read(
        self, ipr: Netlink, names: dict[int, str]
    ) -> tuple[dict[ipaddress.IPv4Network, KernelRoute], dict[ipaddress.IPv4Network, int]]:
        ours: dict[ipaddress.IPv4Network, KernelRoute] = {}
        others: dict[ipaddress.IPv4Network, int] = {}
        for msg in ipr.route("dump", family=socket.AF_INET):
            if _table(msg) != self.table or msg.get("priority") not in (None, 0):
                continue
            dst = ipaddress.IPv4Network(f"{msg.get('dst') or '0.0.0.0'}/{msg['dst_len']}")
            if msg["proto"] == self.proto:
                ours[dst] = _from_message(msg, names)
            elif msg["type"] in _KIND_BY_TYPE:
                others.setdefault(dst, msg["proto"])
        return ours, others

    def _delete(
        self, ipr: Netlink, route: KernelRoute, names: dict[int, str], result: ApplyResult
    ) -> None:
        try:
            ipr.route("del", **_route_args(route, self.table, names))
            result.removed.append(route)
        except Exception as err:
            result.errors.append(f"delete {route}: {err}")

    def _replace(
        self, ipr: Netlink, route: KernelRoute, names: dict[int, str], result: ApplyResult
    ) -> None:
        try:
            ipr.route("replace", **_route_args(route, self.table, names))
            result.added.append(route)
        except Exception as err:
            result.errors.append(f"add {route}: {err}")


def _with_proto(route: KernelRoute, proto: int) -> KernelRoute:
    if route.proto == proto:
        return route
    return KernelRoute(route.dst, route.kind, route.gateway, route.dev, route.onlink, proto)


def _table(msg: Any) -> int:
    return int(msg.get("table") or 0)


def _link_names(ipr: Netlink) -> dict[int, str]:
    return {link["index"]: link.get("ifname") for link in ipr.get_links()}


def _from_message(msg: Any, names: dict[int, str]) -> KernelRoute:
    gateway = msg.get("gateway")
    oif = msg.get("oif")
    kind = _KIND_BY_TYPE.get(msg["type"], f"type{msg['type']}")
    onlink = bool(msg["flags"] & RTNH_F_ONLINK)
    return KernelRoute(
        dst=ipaddress.IPv4Network(f"{msg.get('dst') or '0.0.0.0'}/{msg['dst_len']}"),
        kind=kind,
        gateway=ipaddress.IPv4Address(gateway) if gateway else None,
        # the kernel names the device it resolved even when we gave none: only an
        # onlink route or one without a gateway was given a device by us
        dev=names.get(oif) if oif is not None and (onlink or not gateway) else None,
        onlink=onlink,
        proto=msg["proto"],
    )


def _route_args(route: KernelRoute, table: int, names: dict[int, str]) -> dict[str, Any]:
    args: dict[str, Any] = {
        "dst": str(route.dst),
        "table": table,
        "proto": route.proto,
        "type": _TYPE_BY_KIND.get(route.kind, 1),
    }
    if route.gateway is not None:
        args["gateway"] = str(route.gateway)
    if route.dev:
        index = {name: i for i, name in names.items()}.get(route.dev)
        if index is None:
            raise LookupError(f"device {route.dev} does not exist")
        args["oif"] = index
    if route.onlink:
        args["flags"] = RTNH_F_ONLINK
    return args


class NeighManager:
    """Permanent neighbour and FDB entries on Tabby's VXLAN device."""

    def __init__(self, netlink: Callable[[], Netlink], device: str) -> None:
        self._netlink = netlink
        self.device = device

    def apply(self, neighs: Iterable[NeighEntry], fdbs: Iterable[FdbEntry]) -> list[str]:
        """Replace the desired entries, delete other permanent ones; returns errors."""
        errors: list[str] = []
        ipr = self._netlink()
        try:
            index = {v: k for k, v in _link_names(ipr).items()}.get(self.device)
            if index is None:
                wanted = list(neighs) + list(fdbs)
                return [f"device {self.device} does not exist"] if wanted else []
            errors += self._neighs(ipr, index, list(neighs))
            errors += self._fdbs(ipr, index, list(fdbs))
        finally:
            ipr.close()
        return errors

    def _neighs(self, ipr: Netlink, index: int, wanted: list[NeighEntry]) -> list[str]:
        errors = []
        keep = {(str(n.ip), n.mac) for n in wanted}
        for msg in ipr.neigh("dump", ifindex=index, family=socket.AF_INET):
            key = (msg.get("dst"), (msg.get("lladdr") or "").lower())
            if msg["state"] & NUD_PERMANENT and key not in keep:
                with contextlib.suppress(Exception):
                    ipr.neigh("del", dst=key[0], ifindex=index)
        for n in wanted:
            try:
                ipr.neigh(
                    "replace", dst=str(n.ip), lladdr=n.mac, ifindex=index, state=NUD_PERMANENT
                )
            except Exception as err:
                errors.append(f"neigh {n}: {err}")
        return errors

    def _fdbs(self, ipr: Netlink, index: int, wanted: list[FdbEntry]) -> list[str]:
        errors = []
        keep = {(f.mac, str(f.dst)) for f in wanted}
        for msg in ipr.fdb("dump", ifindex=index):
            key = ((msg.get("lladdr") or "").lower(), msg.get("dst"))
            if msg.get("ifindex") == index and key[1] and key not in keep:
                with contextlib.suppress(Exception):
                    ipr.fdb("del", ifindex=index, lladdr=key[0], dst=key[1], flags=NTF_SELF)
        for f in wanted:
            try:
                ipr.fdb(
                    "replace",
                    ifindex=index,
                    lladdr=f.mac,
                    dst=str(f.dst),
                    state=NUD_PERMANENT,
                    flags=NTF_SELF,
                )
            except Exception as err:
                errors.append(f"fdb {f}: {err}")
        return errors
