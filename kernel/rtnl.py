"""A small synchronous rtnetlink client for the CNI hot path (create and delete a pod's veth).

pyroute2 stays the netlink library of the agent (checks, recovery, BGP routes);
its 0.9 core runs every request through an asyncio loop and a generic message
encoder, which costs ~1.5 ms per request and made wiring a pod 15-25 ms of
Python for ~12 requests. The few messages a fresh pod needs are fixed shapes,
so they are packed here with :mod:`struct` and sent in batches: the kernel
handles every message of one ``sendmsg`` in order and acks each one, so the
pod side (link up, address, two routes) is a single round trip.

Only what wiring needs is here: RTM_NEWLINK (veth pair), RTM_GETLINK by name,
RTM_SETLINK up, RTM_NEWADDR, RTM_NEWROUTE and RTM_DELLINK. Anything unusual
(an existing link, a route owned by another interface) is reported as
:class:`NetlinkError` with the errno, and the caller falls back to the
convergent pyroute2 path in :mod:`felix.wiring`.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address

# message types and flags (linux/rtnetlink.h, linux/netlink.h)
NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_SETLINK = 19
RTM_NEWADDR = 20
RTM_NEWROUTE = 24
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400

# attributes
IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINK = 5
IFLA_LINKINFO = 18
IFLA_NET_NS_FD = 28
IFLA_EXT_MASK = 29
IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
VETH_INFO_PEER = 1
IFA_ADDRESS = 1
IFA_LOCAL = 2
RTA_DST = 1
RTA_OIF = 4
RTA_GATEWAY = 5
RTEXT_FILTER_SKIP_STATS = 1 << 3

AF_UNSPEC = 0
AF_INET = 2
IFF_UP = 0x1
RT_TABLE_MAIN = 254
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253
RTN_UNICAST = 1
RTPROT_BOOT = 3

_NLMSGHDR = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BxHiII")
_IFADDRMSG = struct.Struct("=BBBBi")
_RTMSG = struct.Struct("=BBBBBBBBI")
_RTATTR = struct.Struct("=HH")
_ERRCODE = struct.Struct("=i")


class NetlinkError(OSError):
    """The kernel refused a request; ``errno`` says why."""


@dataclass(frozen=True)
class LinkInfo:
    """The few facts about a link that wiring needs."""

    index: int
    name: str
    mac: str
    mtu: int
    up: bool
    kind: str | None
    peer_index: int | None  # IFLA_LINK: a veth's peer, in its own namespace


def _align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    """One rtattr, padded to 4 bytes."""
    size = _RTATTR.size + len(payload)
    return _RTATTR.pack(size, kind) + payload + b"\0" * (_align(size) - size)


def _name(value: str) -> bytes:
    return value.encode() + b"\0"


def _u32(value: int) -> bytes:
    return struct.pack("=I", value)


def _mac(value: str) -> bytes:
    return bytes(int(part, 16) for part in value.split(":"))


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return _IFINFOMSG.pack(AF_UNSPEC, 0, index, flags, change)


# --- message builders (pure: they return (type, flags, body)) -----------------

Message = tuple[int, int, bytes]
_CREATE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
_REPLACE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE


def new_veth(name: str, mac: str, mtu: int, peer: str, peer_netns_fd: int) -> Message:
    """``ip link add NAME address MAC mtu MTU up type veth peer PEER netns FD mtu MTU``."""
    peer_body = _ifinfo() + attr(IFLA_IFNAME, _name(peer)) + attr(IFLA_MTU, _u32(mtu))
    peer_body += attr(IFLA_NET_NS_FD, _u32(peer_netns_fd))
    info = attr(IFLA_INFO_KIND, b"veth") + attr(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer_body))
    body = _ifinfo(flags=IFF_UP, change=IFF_UP) + attr(IFLA_IFNAME, _name(name))
    body += attr(IFLA_ADDRESS, _mac(mac)) + attr(IFLA_MTU, _u32(mtu)) + attr(IFLA_LINKINFO, info)
    return RTM_NEWLINK, _CREATE, body


def get_link(name: str) -> Message:
    """RTM_GETLINK for one name (the kernel answers with one RTM_NEWLINK)."""
    body = _ifinfo() + attr(IFLA_IFNAME, _name(name))
    body += attr(IFLA_EXT_MASK, _u32(RTEXT_FILTER_SKIP_STATS))
    return RTM_GETLINK, NLM_F_REQUEST, body


def set_up(index: int) -> Message:
    return RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, _ifinfo(index, IFF_UP, IFF_UP)


def del_link(name: str) -> Message:
    return RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, _ifinfo() + attr(IFLA_IFNAME, _name(name))


def new_address(index: int, address: IPv4Address, prefixlen: int = 32) -> Message:
    packed = address.packed
    body = _IFADDRMSG.pack(AF_INET, prefixlen, 0, RT_SCOPE_UNIVERSE, index)
    body += attr(IFA_LOCAL, packed) + attr(IFA_ADDRESS, packed)
    return RTM_NEWADDR, _CREATE, body


def new_route(
    dst: IPv4Address,
    dst_len: int,
    oif: int,
    *,
    gateway: IPv4Address | None = None,
    scope: int = RT_SCOPE_UNIVERSE,
    proto: int = RTPROT_BOOT,
    exclusive: bool = False,
) -> Message:
    """A main-table unicast route; ``exclusive`` refuses to replace an existing one."""
    body = _RTMSG.pack(AF_INET, dst_len, 0, 0, RT_TABLE_MAIN, proto, scope, RTN_UNICAST, 0)
    if dst_len:
        body += attr(RTA_DST, dst.packed)
    if gateway is not None:
        body += attr(RTA_GATEWAY, gateway.packed)
    body += attr(RTA_OIF, _u32(oif))
    return RTM_NEWROUTE, _CREATE if exclusive else _REPLACE, body


# --- parsing --------------------------------------------------------------------


def _attrs(data: bytes, offset: int, end: int) -> Iterator[tuple[int, bytes]]:
    while offset + _RTATTR.size <= end:
        size, kind = _RTATTR.unpack_from(data, offset)
        if size < _RTATTR.size:
            return
        yield kind & 0x3FFF, data[offset + _RTATTR.size : offset + size]
        offset += _align(size)


def parse_link(body: bytes) -> LinkInfo:
    """An RTM_NEWLINK body (ifinfomsg + attributes) as :class:`LinkInfo`."""
    _family, _type, index, flags, _change = _IFINFOMSG.unpack_from(body, 0)
    found = dict(_attrs(body, _IFINFOMSG.size, len(body)))
    kind = None
    if IFLA_LINKINFO in found:
        info = dict(_attrs(found[IFLA_LINKINFO], 0, len(found[IFLA_LINKINFO])))
        if IFLA_INFO_KIND in info:
            kind = info[IFLA_INFO_KIND].rstrip(b"\0").decode()
    link = found.get(IFLA_LINK)
    return LinkInfo(
        index=index,
        name=found.get(IFLA_IFNAME, b"").rstrip(b"\0").decode(),
        mac=":".join(f"{b:02x}" for b in found.get(IFLA_ADDRESS, b"")),
        mtu=struct.unpack("=I", found[IFLA_MTU])[0] if IFLA_MTU in found else 0,
        up=bool(flags & IFF_UP),
        kind=kind,
        peer_index=struct.unpack("=I", link)[0] if link else None,
    )


# --- the socket -------------------------------------------------------------------


class Rtnl:
    """A NETLINK_ROUTE socket bound to the namespace it was created in."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._seq = 0

    @classmethod
    def open(cls) -> Rtnl:
        """A socket in the calling thread's current network namespace."""
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.bind((0, 0))
        return cls(sock)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def request(self, messages: Iterable[Message]) -> list[bytes | None]:
        """Send every message in one datagram; per message, its reply body or None (ack).

        The first refusal raises :class:`NetlinkError`; messages before it took
        effect, those after it were still run by the kernel (their errors are
        dropped: the caller falls back to the convergent path anyway).
        """
        packed, seqs = [], []
        for kind, flags, body in messages:
            self._seq += 1
            seqs.append(self._seq)
            packed.append(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, self._seq, 0))
            packed.append(body)
        self._sock.send(b"".join(packed))
        answers: dict[int, bytes | NetlinkError | None] = {}
        while len(answers) < len(seqs):
            self._collect(self._sock.recv(1 << 16), answers)
        out: list[bytes | None] = []
        for seq in seqs:
            answer = answers[seq]
            if isinstance(answer, NetlinkError):
                raise answer
            out.append(answer)
        return out

    def _collect(self, data: bytes, answers: dict[int, bytes | NetlinkError | None]) -> None:
        offset = 0
        while offset + _NLMSGHDR.size <= len(data):
            size, kind, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
            body = data[offset + _NLMSGHDR.size : offset + size]
            if kind == NLMSG_ERROR:
                code = -_ERRCODE.unpack_from(body, 0)[0]
                answers[seq] = NetlinkError(code, os.strerror(code)) if code else answers.get(seq)
            elif kind != NLMSG_DONE:
                answers[seq] = body
            offset += _align(size)

    def link(self, name: str) -> LinkInfo | None:
        """One link by name, or None when there is none."""
        try:
            (body,) = self.request([get_link(name)])
        except NetlinkError as exc:
            if exc.errno in (errno.ENODEV, errno.ENOENT):
                return None
            raise
        return parse_link(body) if body else None
