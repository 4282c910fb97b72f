"""ExaBGP 5.0 API stream → typed events (pure).

ExaBGP writes one item per line to the API process (research notes 2.3, 2.4):
JSON objects are events, `done`/`error` are acks of our commands, anything else is
text output of a `show` command. Parsing is total: a line we cannot use becomes an
`Unparsed` event instead of an exception, because one odd line from a peer must not
stop the reader.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FAMILY = "ipv4 unicast"
GR_FAMILY = "ipv4/unicast"  # the same family as the GR capability names it


@dataclass(frozen=True, order=True)
class LearnedRoute:
    """One prefix as a peer announced it, with the attributes Tabby acts on."""

    prefix: ipaddress.IPv4Network
    next_hop: ipaddress.IPv4Address
    peer: ipaddress.IPv4Address
    as_path: tuple[int, ...] = ()
    local_pref: int | None = None
    originator_id: ipaddress.IPv4Address | None = None
    cluster_list: tuple[str, ...] = ()


@dataclass(frozen=True)
class StateChange:
    """`connected` (a TCP attempt), `up` (Established) or `down` (with ExaBGP's reason)."""

    peer: ipaddress.IPv4Address
    state: str
    reason: str = ""
    time: float = 0.0


@dataclass(frozen=True)
class RouteUpdate:
    """One UPDATE: announced routes (with next hop) and withdrawn prefixes."""

    peer: ipaddress.IPv4Address
    announced: tuple[LearnedRoute, ...] = ()
    withdrawn: tuple[ipaddress.IPv4Network, ...] = ()
    time: float = 0.0


@dataclass(frozen=True)
class PeerOpen:
    """The peer's OPEN: its router id, and its graceful-restart time if it offers GR."""

    peer: ipaddress.IPv4Address
    router_id: ipaddress.IPv4Address | None = None
    asn: int | None = None
    hold_time: int | None = None
    restart_time: int | None = None


@dataclass(frozen=True)
class EndOfRib:
    peer: ipaddress.IPv4Address
    family: str = FAMILY


@dataclass(frozen=True)
class Shutdown:
    """ExaBGP is stopping; EOF on the stream follows."""


@dataclass(frozen=True)
class Ack:
    ok: bool


@dataclass(frozen=True)
class Unparsed:
    """A line that is not a usable event (show output, other families, garbage)."""

    line: str
    reason: str


Event = StateChange | RouteUpdate | PeerOpen | EndOfRib | Shutdown | Ack | Unparsed


def parse_line(line: str) -> Event:
    """One line of the API stream as an event."""
    text = line.strip()
    if text in ("done", "error"):
        return Ack(ok=text == "done")
    if not text.startswith("{"):
        return Unparsed(text, "not a JSON event")
    try:
        msg = json.loads(text)
    except json.JSONDecodeError as err:
        return Unparsed(text, f"bad JSON: {err}")
    if not isinstance(msg, dict):
        return Unparsed(text, "JSON is not an object")
    try:
        return _parse_message(msg, text)
    except (KeyError, TypeError, ValueError) as err:
        return Unparsed(text, f"unexpected shape: {err!r}")


def _parse_message(msg: Mapping[str, Any], text: str) -> Event:
    kind = msg.get("type")
    if kind == "notification" and msg.get("notification") == "shutdown":
        return Shutdown()
    if kind == "state":
        neighbor = msg["neighbor"]
        return StateChange(
            peer=_peer(neighbor),
            state=str(neighbor["state"]),
            reason=str(neighbor.get("reason", "")),
            time=float(msg.get("time", 0.0)),
        )
    if kind == "update":
        return _parse_update(msg, text)
    if kind == "open":
        return _parse_open(msg, text)
    return Unparsed(text, f"type {kind!r} not used")


def _peer(neighbor: Mapping[str, Any]) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(neighbor["address"]["peer"])


def _parse_update(msg: Mapping[str, Any], text: str) -> Event:
    neighbor = msg["neighbor"]
    if neighbor.get("direction", "receive") != "receive":
        return Unparsed(text, "not a received update")
    peer = _peer(neighbor)
    body = neighbor["message"]
    if "eor" in body:
        eor = body["eor"]
        return EndOfRib(peer, f"{eor.get('afi')} {eor.get('safi')}")
    update = body["update"]
    attrs = _attributes(update.get("attribute") or {})
    announced = tuple(_announced(peer, update.get("announce") or {}, attrs))
    withdrawn = tuple(_prefixes((update.get("withdraw") or {}).get(FAMILY) or []))
    return RouteUpdate(peer, announced, withdrawn, float(msg.get("time", 0.0)))


def _parse_open(msg: Mapping[str, Any], text: str) -> Event:
    """Only the peer's OPEN (direction receive) tells us about the peer."""
    neighbor = msg["neighbor"]
    if neighbor.get("direction") != "receive":
        return Unparsed(text, "our own OPEN")
    body = neighbor["open"]
    restart = None
    for cap in (body.get("capabilities") or {}).values():
        if not isinstance(cap, dict) or cap.get("name") != "graceful restart":
            continue
        # RFC 4724: only the families listed keep forwarding state across a restart
        # (BIRD's default "aware" mode lists none)
        if GR_FAMILY in (cap.get("address-family-flags") or {}):
            restart = int(cap.get("time", 0))
    router_id = body.get("router_id")
    return PeerOpen(
        peer=_peer(neighbor),
        router_id=ipaddress.IPv4Address(router_id) if router_id else None,
        asn=int(body["asn"]) if "asn" in body else None,
        hold_time=int(body["hold_time"]) if "hold_time" in body else None,
        restart_time=restart,
    )


def _announced(
    peer: ipaddress.IPv4Address, announce: Mapping[str, Any], attrs: Mapping[str, Any]
) -> Iterable[LearnedRoute]:
    """`{"ipv4 unicast": {"<next hop>": [nlri...]}}`: the key is the next hop."""
    for next_hop, nlris in (announce.get(FAMILY) or {}).items():
        hop = ipaddress.IPv4Address(next_hop)
        for prefix in _prefixes(nlris):
            yield LearnedRoute(prefix=prefix, next_hop=hop, peer=peer, **attrs)


def _prefixes(nlris: Iterable[Any]) -> Iterable[ipaddress.IPv4Network]:
    """NLRI entries are `{"nlri": "p"}`, or plain strings with `exabgp_api_compact`."""
    for item in nlris:
        raw = item["nlri"] if isinstance(item, dict) else item
        yield ipaddress.IPv4Network(str(raw), strict=False)


def _attributes(attr: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"as_path": _as_path(attr.get("as-path"))}
    if "local-preference" in attr:
        out["local_pref"] = int(attr["local-preference"])
    if "originator-id" in attr:
        out["originator_id"] = ipaddress.IPv4Address(attr["originator-id"])
    if "cluster-list" in attr:
        out["cluster_list"] = tuple(str(c) for c in attr["cluster-list"])
    return out


def _as_path(raw: Any) -> tuple[int, ...]:
    """5.0: `{"0": {"element": "as-sequence", "value": [..]}}`; 4.x: a plain list."""
    if raw is None:
        return ()
    if isinstance(raw, list):
        return tuple(int(a) for a in raw)
    path: list[int] = []
    for key in sorted(raw, key=int):
        path.extend(int(a) for a in raw[key].get("value", []))
    return tuple(path)
