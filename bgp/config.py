"""Who this node peers with, and the ExaBGP configuration that says so.

Pure: BGPConfiguration + Node dicts + BGPPeers + this node's name in, a `BGPPlan`
(local speaker facts and the sorted set of desired peers) out, then ExaBGP config
text from the plan. The same inputs always give byte-identical text, so the agent
can compare old and new text to decide whether ExaBGP needs a reload.

Topology rules (Calico's, adapted to ExaBGP):
- Full mesh (BGPConfiguration `nodeToNodeMeshEnabled`, default on): every node
  peers with every other node that has an address.
- Route reflectors: as soon as any node carries the cluster-id annotation, the
  reflector topology replaces the mesh: reflectors peer with every other node,
  other nodes peer only with the reflectors. A reflector treats a same-AS peer
  whose cluster id differs from its own (plain nodes included) as its RR client,
  like Calico's BIRD template does.
- BGPPeers: `node` or `nodeSelector` choose the local nodes (neither = global);
  `peerIP` (with `asNumber`) or `peerSelector` (each matching node, with that
  node's own AS) choose the remote side.
- One peering per address: explicit peers win over implicit ones
  (node specific > global > route reflector > node-to-node mesh).
- Passwords (TCP MD5, RFC 2385): BGPConfiguration `nodeMeshPassword` keys every
  mesh and route-reflector session, a BGPPeer's `password` the sessions it makes.
  Both name a key of the one Secret Tabby reads (`BGP_SECRET`); a key that is not
  there leaves those sessions out and says why in `problems` (never a session
  without the password the operator asked for).
- Passive/active between cluster nodes: the node with the lower address waits
  (passive) and the higher one dials, Calico's rule to avoid session collisions
  and graceful-restart races. Every node listens, or the passive side could
  never be reached (ExaBGP does not listen by default). External peers are dialled.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from bgp.nodes import NodeFacts, parse_nodes
from datastore.models import BGPConfiguration, BGPPassword, BGPPeer

log = logging.getLogger(__name__)

MESH: Final = "node-to-node mesh"
ROUTE_REFLECTOR: Final = "route reflector"
GLOBAL: Final = "global"
NODE_SPECIFIC: Final = "node specific"
PEER_TYPES: Final = (MESH, ROUTE_REFLECTOR, GLOBAL, NODE_SPECIFIC)

# lower wins when two rules ask for the same peer address
_PRECEDENCE: Final = {NODE_SPECIFIC: 0, GLOBAL: 1, ROUTE_REFLECTOR: 2, MESH: 3}

DEFAULT_PORT: Final = 179
DEFAULT_HOLD_TIME: Final = 30
DEFAULT_RESTART_TIME: Final = 120
API_PROCESS: Final = "tabby-api"
TEMPLATE: Final = "tabby-peer"
# The one Secret BGP passwords are read from (tabby-node may read no other; the CRDs
# refuse any other name), in the agent's namespace.
BGP_SECRET: Final = "tabby-bgp-passwords"
BGP_SECRET_NAMESPACE: Final = "kube-system"
MAX_PASSWORD_BYTES: Final = 80  # TCP_MD5SIG_MAXKEYLEN

Passwords = Mapping[str, str]  # a key of BGP_SECRET -> its value (decoded)

SelectorMatch = Callable[[str, Mapping[str, str]], bool]


@dataclass(frozen=True)
class DesiredPeer:
    """One BGP session this node should have."""

    address: ipaddress.IPv4Address
    as_number: int
    peer_type: str
    passive: bool = False
    rr_client: bool = False
    port: int = DEFAULT_PORT
    node: str | None = None  # the remote node's name when the peer is a cluster node
    source: str = ""  # what asked for it: "mesh", "reflector" or "bgppeer/<name>"
    password: str | None = field(default=None, repr=False)  # TCP MD5, never logged
    password_key: str | None = None  # where it came from: a key of BGP_SECRET

    def sort_key(self) -> tuple[int, int]:
        return (int(self.address), self.port)


@dataclass(frozen=True)
class LocalSpeaker:
    """This node's side of every session."""

    node: str
    address: ipaddress.IPv4Interface
    as_number: int
    listen_port: int = DEFAULT_PORT
    rr_cluster_id: str | None = None

    @property
    def router_id(self) -> ipaddress.IPv4Address:
        """The node address doubles as router id, so peers can map ORIGINATOR_ID to a node."""
        return self.address.ip


@dataclass(frozen=True)
class BGPPlan:
    """Everything the speaker needs; `problems` lists inputs that were skipped, and why."""

    local: LocalSpeaker
    peers: tuple[DesiredPeer, ...]
    problems: tuple[str, ...] = ()

    def peer(self, address: str | ipaddress.IPv4Address) -> DesiredPeer | None:
        wanted = ipaddress.IPv4Address(str(address))
        return next((p for p in self.peers if p.address == wanted), None)


def default_selector_match(expr: str, labels: Mapping[str, str]) -> bool:
    """Calico-style selector match through ipam.selector (imported late: a separate module)."""
    from ipam.selector import parse_selector

    return bool(parse_selector(expr).matches(labels))


# -- peers --------------------------------------------------------------------------------


def compute_plan(
    config: BGPConfiguration | None,
    nodes: Iterable[Mapping[str, Any]],
    bgp_peers: Iterable[BGPPeer],
    node_name: str,
    selector_match: SelectorMatch = default_selector_match,
    passwords: Passwords | None = None,
) -> BGPPlan | None:
    """The desired peerings of `node_name`; None while that node has no usable address.

    ``passwords``: the keys of BGP_SECRET as they are now (None or {}: no Secret).
    """
    passwords = passwords or {}
    cfg = (config or BGPConfiguration.model_validate({"metadata": {"name": "default"}})).spec
    facts = parse_nodes(nodes)
    me = facts.get(node_name)
    if me is None:
        return None
    local = LocalSpeaker(
        node=me.name,
        address=me.address,
        as_number=me.asn(cfg.as_number),
        listen_port=cfg.listen_port,
        rr_cluster_id=me.rr_cluster_id,
    )
    ctx = _Context(me, local, facts, cfg.as_number, cfg.listen_port, selector_match)
    cluster = _cluster_peers(ctx, mesh=cfg.node_to_node_mesh_enabled)
    candidates, problems = _with_password(
        cluster, cfg.node_mesh_password, passwords, "bgpconfiguration nodeMeshPassword"
    )
    for bgp_peer in sorted(bgp_peers, key=lambda p: p.name):
        found, errors = _explicit_peers(ctx, bgp_peer)
        if not errors:
            found, errors = _with_password(
                found, bgp_peer.spec.password, passwords, f"bgppeer/{bgp_peer.name} password"
            )
        candidates.extend(found)
        problems.extend(errors)
    return BGPPlan(local=local, peers=_dedupe(candidates), problems=tuple(problems))


def _with_password(
    peers: list[DesiredPeer], ref: BGPPassword | None, passwords: Passwords, where: str
) -> tuple[list[DesiredPeer], list[str]]:
    """The peers keyed with the referenced password, or none of them and why."""
    if ref is None or not peers:
        return peers, []
    secret, key = ref.secret_key_ref.name, ref.secret_key_ref.key
    problem = password_problem(secret, key, passwords)
    if problem is not None:
        left_out = ", ".join(str(p.address) for p in peers)
        return [], [f"{where}: {problem}; sessions with {left_out} are not configured"]
    return [replace(p, password=passwords[key], password_key=key) for p in peers], []


def password_problem(secret: str, key: str, passwords: Passwords) -> str | None:
    """Why a password reference cannot be used, or None when it can."""
    where = f"Secret {BGP_SECRET_NAMESPACE}/{BGP_SECRET}"
    if secret != BGP_SECRET:
        return f"passwords are read from {where} only, not {secret!r}"
    if key not in passwords:
        return f"{where} has no key {key!r} (or does not exist)"
    size = len(passwords[key].encode())
    if not 1 <= size <= MAX_PASSWORD_BYTES:
        return f"{where} key {key!r} is {size} bytes; a TCP MD5 password is 1 to 80"
    return None


@dataclass(frozen=True)
class _Context:
    me: NodeFacts
    local: LocalSpeaker
    facts: Mapping[str, NodeFacts]
    default_as: int
    port: int
    match: SelectorMatch

    def others(self) -> list[NodeFacts]:
        """Other nodes, in a stable order, never one sharing our own address."""
        return sorted(
            (f for f in self.facts.values() if f.name != self.me.name and f.ip != self.me.ip),
            key=lambda f: (int(f.ip), f.name),
        )

    def node_by_ip(self, ip: ipaddress.IPv4Address) -> NodeFacts | None:
        return next((f for f in self.others() if f.ip == ip), None)


def _cluster_peers(ctx: _Context, *, mesh: bool) -> list[DesiredPeer]:
    """Mesh or reflector peerings, implied by the nodes themselves."""
    others = ctx.others()
    if ctx.me.is_route_reflector or any(o.is_route_reflector for o in others):
        targets = others if ctx.me.is_route_reflector else [o for o in others if o.rr_cluster_id]
        return [_node_peer(ctx, o, ROUTE_REFLECTOR, "reflector") for o in targets]
    if not mesh:
        return []
    return [_node_peer(ctx, o, MESH, "mesh") for o in others]


def _node_peer(
    ctx: _Context, other: NodeFacts, peer_type: str, source: str, port: int | None = None
) -> DesiredPeer:
    peer_as = other.asn(ctx.default_as)
    return DesiredPeer(
        address=other.ip,
        as_number=peer_as,
        peer_type=peer_type,
        passive=int(other.ip) > int(ctx.me.ip),
        rr_client=_is_rr_client(ctx, other, peer_as),
        port=port if port is not None else ctx.port,
        node=other.name,
        source=source,
    )


def _is_rr_client(ctx: _Context, other: NodeFacts, peer_as: int) -> bool:
    """RFC 4456: only a reflector has clients, only over iBGP, never in its own cluster."""
    me = ctx.me
    return (
        me.rr_cluster_id is not None
        and peer_as == ctx.local.as_number
        and other.rr_cluster_id != me.rr_cluster_id
    )


def _applies_to_me(ctx: _Context, bgp_peer: BGPPeer) -> bool:
    spec = bgp_peer.spec
    if spec.node:
        return spec.node == ctx.me.name
    if spec.node_selector:
        return ctx.match(spec.node_selector, ctx.me.labels)
    return True


def _explicit_peers(ctx: _Context, bgp_peer: BGPPeer) -> tuple[list[DesiredPeer], list[str]]:
    """The peerings one BGPPeer asks of this node, and any problem with it."""
    spec = bgp_peer.spec
    where = f"bgppeer/{bgp_peer.name}"
    try:
        if spec.node and spec.node_selector:
            return [], [f"{where}: node and nodeSelector are mutually exclusive"]
        if spec.peer_ip and spec.peer_selector:
            return [], [f"{where}: peerIP and peerSelector are mutually exclusive"]
        if not _applies_to_me(ctx, bgp_peer):
            return [], []
        peer_type = NODE_SPECIFIC if (spec.node or spec.node_selector) else GLOBAL
        if spec.peer_selector:
            return _selector_peers(ctx, bgp_peer, peer_type, where)
        if spec.peer_ip:
            return _ip_peer(ctx, bgp_peer, peer_type, where)
        return [], [f"{where}: needs peerIP or peerSelector"]
    except Exception as err:  # a bad selector must not take the other peers down
        return [], [f"{where}: {err}"]


def _selector_peers(
    ctx: _Context, bgp_peer: BGPPeer, peer_type: str, where: str
) -> tuple[list[DesiredPeer], list[str]]:
    problems = []
    if bgp_peer.spec.as_number is not None:
        problems.append(f"{where}: asNumber is ignored with peerSelector (each node's AS is used)")
    selector = bgp_peer.spec.peer_selector or ""
    found = [
        _node_peer(ctx, other, peer_type, where)
        for other in ctx.others()
        if ctx.match(selector, other.labels)
    ]
    return found, problems


def _ip_peer(
    ctx: _Context, bgp_peer: BGPPeer, peer_type: str, where: str
) -> tuple[list[DesiredPeer], list[str]]:
    address, port = parse_peer_ip(bgp_peer.spec.peer_ip or "", ctx.port)
    if address == ctx.me.ip:
        return [], []  # a global peer naming this very node: nothing to do
    other = ctx.node_by_ip(address)
    if other is not None and bgp_peer.spec.as_number is None:
        return [_node_peer(ctx, other, peer_type, where, port)], []
    if bgp_peer.spec.as_number is None:
        return [], [f"{where}: asNumber is required with peerIP {address}"]
    if other is not None:
        peer = _node_peer(ctx, other, peer_type, where, port)
        return [_with_as(ctx, peer, other, bgp_peer.spec.as_number)], []
    external = DesiredPeer(
        address=address,
        as_number=bgp_peer.spec.as_number,
        peer_type=peer_type,
        port=port,
        source=where,
    )
    return [external], []


def _with_as(ctx: _Context, peer: DesiredPeer, other: NodeFacts, as_number: int) -> DesiredPeer:
    return DesiredPeer(
        address=peer.address,
        as_number=as_number,
        peer_type=peer.peer_type,
        passive=peer.passive,
        rr_client=_is_rr_client(ctx, other, as_number),
        port=peer.port,
        node=peer.node,
        source=peer.source,
    )


def parse_peer_ip(raw: str, default_port: int = DEFAULT_PORT) -> tuple[ipaddress.IPv4Address, int]:
    """`10.0.0.1` or `10.0.0.1:1179`: exactly the forms the BGPPeer CRD admits.

    Anything else raises ValueError with a message naming the form expected (the
    plan reports it as that BGPPeer's problem and skips it). IPv6, bare or as
    `[fd00::1]:179` (Calico's form), is refused as unsupported, as the CRD does.
    """
    if raw.startswith("[") or raw.count(":") > 1:
        raise ValueError(
            f"peerIP {raw!r}: IPv6 peers are not supported; give an IPv4 address, "
            "optionally with a port (10.0.0.1 or 10.0.0.1:1179)"
        )
    host, sep, port = raw.partition(":")
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(
            f"peerIP {raw!r}: {host!r} is not an IPv4 address (expected 10.0.0.1 or 10.0.0.1:1179)"
        ) from None
    if not sep:
        return address, default_port
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        raise ValueError(f"peerIP {raw!r}: the port {port!r} is not a number from 1 to 65535")
    return address, int(port)


def _dedupe(candidates: Iterable[DesiredPeer]) -> tuple[DesiredPeer, ...]:
    """One peer per address; the most explicit rule wins, then the first BGPPeer by name."""
    best: dict[ipaddress.IPv4Address, DesiredPeer] = {}
    for peer in candidates:
        current = best.get(peer.address)
        if current is None or _PRECEDENCE[peer.peer_type] < _PRECEDENCE[current.peer_type]:
            best[peer.address] = peer
    return tuple(sorted(best.values(), key=DesiredPeer.sort_key))


# -- ExaBGP configuration -----------------------------------------------------------------


@dataclass(frozen=True)
class RenderOptions:
    """Knobs of the rendered file that do not come from the datastore."""

    hold_time: int = DEFAULT_HOLD_TIME
    graceful_restart: int | None = DEFAULT_RESTART_TIME
    route_refresh: bool = True


def render_exabgp_config(
    plan: BGPPlan, helper_argv: Sequence[str], options: RenderOptions | None = None
) -> str:
    """ExaBGP 5.0 configuration text for a plan (see research notes 1.1, 1.2, 6.2).

    - `manual-eor true`: the speaker sends End-of-RIB itself after re-announcing,
      so a graceful-restart helper peer never flushes our routes early.
    - `listen <port>` on every neighbor: ExaBGP only dials out otherwise, and passive
      sessions could never come up.
    - The API process gets parsed UPDATEs, the peers' OPENs (router id and
      graceful-restart time, which the `negotiated` message lacks) and neighbor
      state changes, as JSON.
    """
    opts = options or RenderOptions()
    _check_argv(helper_argv)
    local = plan.local
    lines = [
        f"# Generated by Tabby for node {local.node}. Do not edit: rewritten on change.",
        f"process {API_PROCESS} {{",
        f"    run {' '.join(helper_argv)};",
        "    encoder json;",
        "}",
        "",
        "template {",
        f"    neighbor {TEMPLATE} {{",
        f"        router-id {local.router_id};",
        f"        local-address {local.address.ip};",
        f"        local-as {local.as_number};",
        f"        hold-time {opts.hold_time};",
        f"        listen {local.listen_port};",
        "        family {",
        "            ipv4 unicast;",
        "        }",
        *_capability_lines(opts),
        "        manual-eor true;",
        "        api {",
        f"            processes [ {API_PROCESS} ];",
        "            receive {",
        "                parsed;",
        "                update;",
        "                open;",
        "            }",
        "            neighbor-changes;",
        "        }",
        "    }",
        "}",
    ]
    for peer in plan.peers:
        lines.extend(_neighbor_lines(peer))
    return "\n".join(lines) + "\n"


def _capability_lines(opts: RenderOptions) -> list[str]:
    inner = []
    if opts.route_refresh:
        inner.append("            route-refresh;")
    if opts.graceful_restart is not None:
        inner.append(f"            graceful-restart {opts.graceful_restart};")
    if not inner:
        return []
    return ["        capability {", *inner, "        }"]


def _neighbor_lines(peer: DesiredPeer) -> list[str]:
    label = peer.peer_type if peer.node is None else f"{peer.peer_type} {peer.node}"
    if peer.rr_client:
        label += " rr-client"
    lines = [
        "",
        f"neighbor {peer.address} {{",
        f"    inherit {TEMPLATE};",
        f'    description "{_safe(label)}";',
        f"    peer-as {peer.as_number};",
    ]
    if peer.port != DEFAULT_PORT:
        lines.append(f"    connect {peer.port};")
    if peer.passive:
        lines.append("    passive true;")
    if peer.password is not None:
        # base64: any byte of the password is safe in ExaBGP's syntax
        encoded = base64.b64encode(peer.password.encode()).decode()
        lines.append(f"    md5-password {encoded};")
        lines.append("    md5-base64 true;")
    lines.append("}")
    return lines


def _safe(text: str) -> str:
    return "".join(c for c in text if c.isalnum() or c in " -_./")


def _check_argv(argv: Sequence[str]) -> None:
    """ExaBGP splits `run` on whitespace and ends it at ';': refuse what it would mangle."""
    if not argv or not argv[0].startswith("/"):
        raise ValueError("helper argv must start with an absolute path")
    for arg in argv:
        if not arg or any(c.isspace() or c in ";{}\"'" for c in arg):
            raise ValueError(f"helper argument {arg!r} cannot be written into an ExaBGP config")
