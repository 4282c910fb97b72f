"""The speaker's brain (pure): learned routes per peer, peer states, what to send.

ExaBGP only speaks BGP (research notes 5.1, 6.1, 7.1), so this class does what a
full BGP daemon would do for Tabby:
- keeps the learned routes per peer and drops them all when the peer goes down
  (ExaBGP sends no withdraws for a dead session);
- drops looped or echoed routes: our own router id as ORIGINATOR_ID, our cluster
  id in CLUSTER_LIST, our AS in AS_PATH, our own address as next hop, our own
  announced prefixes;
- keeps, per configured peer, the routes we want that peer to have (our own
  prefixes with `next-hop self`, plus reflected routes when this node is a route
  reflector) and emits only the difference as ExaBGP API commands;
- on every `up` replays that peer's full set and sends End-of-RIB (the config uses
  `manual-eor`, so ExaBGP does not; research notes 6.2);
- graceful restart, receiving side (ExaBGP has none, research notes 6.3): a peer
  whose OPEN offered GR and whose session ends without a NOTIFICATION keeps its
  routes as stale until its End-of-RIB or its restart time (`tick()` expires them);
- `synced()`: until every peer has sent End-of-RIB once (or a startup grace has
  passed) the agent should not prune kernel routes it cannot explain yet.

Route reflection (RFC 4456 on top of the API, research notes 5.2): the best route
for a prefix, learned over iBGP, goes from a client to every other iBGP peer and
from a non-client to clients only, keeping its next hop, with ORIGINATOR_ID (the
original speaker; Tabby nodes use their address as router id) and our cluster id
prepended to CLUSTER_LIST. Routes from eBGP peers are not re-advertised: nodes are
not transit routers.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from bgp.config import BGPPlan, DesiredPeer, LocalSpeaker
from bgp.messages import (
    FAMILY,
    EndOfRib,
    Event,
    LearnedRoute,
    PeerOpen,
    RouteUpdate,
    Shutdown,
    StateChange,
)
from bgp.routes import best_routes

Network = ipaddress.IPv4Network
Address = ipaddress.IPv4Address

SELF = "self"
DEFAULT_STARTUP_GRACE = 120.0


@dataclass(frozen=True)
class OutRoute:
    """A route as we announce it to one peer."""

    prefix: Network
    next_hop: str = SELF
    originator_id: Address | None = None
    cluster_list: tuple[str, ...] = ()

    def announce(self, peer: Address) -> str:
        text = f"neighbor {peer} announce route {self.prefix} next-hop {self.next_hop}"
        if self.originator_id is not None:
            text += f" originator-id {self.originator_id}"
        if self.cluster_list:
            text += f" cluster-list [ {' '.join(self.cluster_list)} ]"
        return text


@dataclass
class PeerStatus:
    """What `tabbyctl node status` shows for one peer (Calico's columns)."""

    address: str
    peer_type: str
    as_number: int
    node: str | None = None
    state: str = "start"  # up | start (BIRD's protocol states, as calicoctl shows them)
    info: str = "Idle"  # Established | Connect | Active | Idle (+ reason)
    since: float = field(default_factory=time.time)
    routes_received: int = 0
    rr_client: bool = False
    stale_routes: int = 0
    sessions: int = 0  # how many times the session came up: flaps show here
    password_key: str | None = None  # the TCP MD5 password's key in the Secret, if any

    def to_json(self) -> dict[str, object]:
        return {
            "address": self.address,
            "type": self.peer_type,
            "asNumber": self.as_number,
            "node": self.node,
            "state": self.state,
            "since": self.since,
            "info": self.info,
            "routesReceived": self.routes_received,
            "rrClient": self.rr_client,
            "staleRoutes": self.stale_routes,
            "sessions": self.sessions,
            "passwordKey": self.password_key,
        }


class SpeakerCore:
    """Event in, commands out; never does I/O. Not thread-safe: the caller serialises."""

    def __init__(
        self,
        plan: BGPPlan,
        clock: Callable[[], float] = time.time,
        startup_grace: float = DEFAULT_STARTUP_GRACE,
    ) -> None:
        self._clock = clock
        self.started = clock()
        self.startup_grace = startup_grace
        self.opens: dict[Address, PeerOpen] = {}  # the last OPEN of each peer
        # routes of a graceful-restarting peer: (deadline, routes) until EoR or deadline
        self.stale: dict[Address, tuple[float, dict[Network, LearnedRoute]]] = {}
        self.eor_seen: set[Address] = set()
        self.local: LocalSpeaker = plan.local
        self.peers: dict[Address, DesiredPeer] = {}
        self.status: dict[Address, PeerStatus] = {}
        self.learned: dict[Address, dict[Network, LearnedRoute]] = {}
        self.up: set[Address] = set()
        self.origin: frozenset[Network] = frozenset()
        self.sent: dict[Address, dict[Network, OutRoute]] = {}
        # every prefix announced per peer since ExaBGP started: resync() withdraws the
        # ones no longer wanted, in case commands were lost while no helper was attached
        self.ever_sent: dict[Address, set[Network]] = {}
        self.dropped = 0  # looped or echoed routes filtered, for metrics
        self.set_plan(plan)

    # -- inputs from the agent ------------------------------------------------------------
    def set_plan(self, plan: BGPPlan) -> list[str]:
        """New peer set: forget removed peers (and their routes), start tracking new ones."""
        self.local = plan.local
        wanted = {p.address: p for p in plan.peers}
        for gone in set(self.peers) - set(wanted):
            self.learned.pop(gone, None)
            self.stale.pop(gone, None)
            self.opens.pop(gone, None)
            self.eor_seen.discard(gone)
            self.sent.pop(gone, None)
            self.ever_sent.pop(gone, None)
            self.status.pop(gone, None)
            self.up.discard(gone)
        for address, peer in wanted.items():
            current = self.status.get(address)
            if current is None:
                self.status[address] = PeerStatus(
                    str(address), peer.peer_type, peer.as_number, peer.node, since=self._clock()
                )
            else:
                current.peer_type, current.as_number = peer.peer_type, peer.as_number
                current.node = peer.node
            self.status[address].rr_client = peer.rr_client
            self.status[address].password_key = peer.password_key
        self.peers = wanted
        return self._sync_all()

    def set_origin(self, prefixes: Iterable[Network]) -> list[str]:
        """Our own announcements changed: send only the difference, to every peer."""
        old, self.origin = self.origin, frozenset(prefixes)
        for peer, routes in self.learned.items():
            self.learned[peer] = {p: r for p, r in routes.items() if p not in self.origin}
        return self._sync_prefixes(old ^ self.origin)

    def speaker_restarted(self) -> list[str]:
        """A new ExaBGP process: its adj-rib-out is empty, every session starts over."""
        for address in list(self.up):
            self._mark_down(address, "speaker restarted")
        self.sent = {}
        self.ever_sent = {}
        return self._sync_all()

    def resync(self) -> list[str]:
        """A (new) API connection: send every peer its full set again (idempotent in ExaBGP)."""
        commands = []
        best = self._best()
        for target in sorted(self.peers, key=int):
            desired = self.desired_out(target, best)
            stale = sorted(self.ever_sent.get(target, set()) - set(desired))
            commands += [f"neighbor {target} withdraw route {p}" for p in stale]
            commands += [route.announce(target) for route in desired.values()]
            self.sent[target] = desired
            self.ever_sent[target] = set(desired)
        return commands

    # -- inputs from ExaBGP ---------------------------------------------------------------
    def handle(self, event: Event) -> list[str]:
        """Apply one API event; returns the commands to write back to ExaBGP."""
        if isinstance(event, StateChange):
            return self._on_state(event)
        if isinstance(event, RouteUpdate):
            return self._on_update(event)
        if isinstance(event, PeerOpen):
            if event.peer in self.peers:
                self.opens[event.peer] = event
            return []
        if isinstance(event, EndOfRib):
            return self._on_eor(event)
        if isinstance(event, Shutdown):
            return self.speaker_restarted()
        return []

    def _on_state(self, event: StateChange) -> list[str]:
        status = self.status.get(event.peer)
        if status is None:
            return []  # a neighbor we no longer want; its session is being torn down
        if event.state == "up":
            self.up.add(event.peer)
            status.sessions += 1
            self._set_status(status, "up", "Established", event.time)
            return self._replay(event.peer)
        if event.state == "connected":
            if event.peer not in self.up:
                self._set_status(status, "start", "Connect", event.time)
            return []
        if event.state == "down":
            return self._sync_prefixes(self._mark_down(event.peer, event.reason, event.time))
        return []

    def _set_status(self, status: PeerStatus, state: str, info: str, when: float) -> None:
        if (status.state, status.info) != (state, info):
            status.since = when or self._clock()
        status.state, status.info = state, info

    def _mark_down(self, peer: Address, reason: str, when: float = 0.0) -> set[Network]:
        """The session is gone; returns the prefixes whose routes may have changed."""
        self.up.discard(peer)
        routes = self.learned.pop(peer, {})
        affected = set(routes) | set(self.stale.get(peer, (0.0, {}))[1])
        self._keep_stale(peer, routes, reason)
        status = self.status.get(peer)
        if status is not None:
            info = f"Active: {reason}" if reason else "Active"
            self._set_status(status, "start", info, when)
            status.routes_received = 0
        return affected

    def _keep_stale(self, peer: Address, routes: dict[Network, LearnedRoute], reason: str) -> None:
        """RFC 4724 receiving side: keep a GR peer's routes until its EoR or its restart time.

        A session closed by a NOTIFICATION is not a restart: its routes go at once.
        """
        opened = self.opens.get(peer)
        restart = opened.restart_time if opened is not None else None
        if not restart or "notification" in reason:
            self.stale.pop(peer, None)
            return
        deadline, kept = self.stale.get(peer, (self._clock() + restart, {}))
        kept.update(routes)
        if kept:
            self.stale[peer] = (deadline, kept)

    def _on_eor(self, event: EndOfRib) -> list[str]:
        """End-of-RIB: the peer has re-sent everything; what is still stale is gone."""
        if event.peer not in self.peers:
            return []
        self.eor_seen.add(event.peer)
        _, swept = self.stale.pop(event.peer, (0.0, {}))
        return self._sync_prefixes(swept)

    def tick(self) -> tuple[bool, list[str]]:
        """Expire stale routes past their deadline: (anything changed, commands)."""
        now = self._clock()
        expired = [peer for peer, (deadline, _) in self.stale.items() if deadline <= now]
        affected: set[Network] = set()
        for peer in expired:
            affected |= set(self.stale.pop(peer)[1])
        return bool(expired), self._sync_prefixes(affected)

    def synced(self) -> bool:
        """Initial sync done: every peer sent End-of-RIB once, or the startup grace passed.

        Until then the agent keeps kernel routes it cannot explain yet (they were
        learned before a restart), so an agent restart changes no packet's fate.
        """
        if all(peer in self.eor_seen for peer in self.peers):
            return True
        return self._clock() >= self.started + self.startup_grace

    def _on_update(self, event: RouteUpdate) -> list[str]:
        if event.peer not in self.peers:
            return []
        table = self.learned.setdefault(event.peer, {})
        stale = self.stale.get(event.peer, (0.0, {}))[1]
        for prefix in event.withdrawn:
            table.pop(prefix, None)
            stale.pop(prefix, None)
        for route in event.announced:
            if self._looped(route):
                self.dropped += 1
                table.pop(route.prefix, None)  # an implicit withdraw of what we had
                stale.pop(route.prefix, None)
                continue
            table[route.prefix] = route
        self.status[event.peer].routes_received = len(table)
        return self._sync_prefixes({*event.withdrawn, *(r.prefix for r in event.announced)})

    def _looped(self, route: LearnedRoute) -> bool:
        local = self.local
        return (
            route.originator_id == local.router_id
            or (local.rr_cluster_id is not None and local.rr_cluster_id in route.cluster_list)
            or local.as_number in route.as_path
            or route.next_hop == local.address.ip
            or route.prefix in self.origin
        )

    # -- outputs ----------------------------------------------------------------------
    def learned_routes(self) -> list[LearnedRoute]:
        """Every usable route: from peers that are up, and stale ones of restarting peers."""
        return sorted(self._usable())

    def _usable(self) -> list[LearnedRoute]:
        routes: list[LearnedRoute] = []
        for peer in self.peers:
            current = self.learned.get(peer, {}) if peer in self.up else {}
            routes.extend(current.values())
            stale = self.stale.get(peer, (0.0, {}))[1]
            routes.extend(r for p, r in stale.items() if p not in current)
        return routes

    def peer_statuses(self) -> list[PeerStatus]:
        for address, status in self.status.items():
            status.stale_routes = len(self.stale.get(address, (0.0, {}))[1])
        return [self.status[a] for a in sorted(self.status, key=int)]

    def desired_out(
        self, target: Address, best: Mapping[Network, LearnedRoute] | None = None
    ) -> dict[Network, OutRoute]:
        """Everything `target` should have from us: own prefixes plus reflected routes.

        `best` (the best route per prefix) may be passed in when many targets are
        computed in a row, so it is computed once instead of once per peer.
        """
        best = best if best is not None else self._best()
        out: dict[Network, OutRoute] = {}
        for prefix in sorted(self.origin | set(best)):
            route = self._desired_for(target, prefix, best)
            if route is not None:
                out[prefix] = route
        return out

    def _desired_for(
        self, target: Address, prefix: Network, best: Mapping[Network, LearnedRoute]
    ) -> OutRoute | None:
        """What `target` should have from us for one prefix, if anything."""
        if prefix in self.origin:
            return OutRoute(prefix)
        route = best.get(prefix)
        return self._reflect(route, target) if route is not None else None

    def _reflect(self, route: LearnedRoute, target: Address) -> OutRoute | None:
        """The reflected form of a learned route for `target`, or None if not for it."""
        cluster = self.local.rr_cluster_id
        peer = self.peers.get(target)
        source = self.peers.get(route.peer)
        if cluster is None or peer is None or source is None or not self._ibgp(peer):
            return None
        if not self._may_reflect(source, peer, route):
            return None
        return OutRoute(
            prefix=route.prefix,
            next_hop=str(route.next_hop),
            originator_id=route.originator_id or self._router_id(route.peer),
            cluster_list=(cluster, *route.cluster_list),
        )

    def _best(self, prefixes: set[Network] | None = None) -> dict[Network, LearnedRoute]:
        """Best usable route per prefix (all, or only `prefixes`); only a reflector needs it."""
        if self.local.rr_cluster_id is None:
            return {}
        usable = self._usable()
        if prefixes is not None:
            usable = [r for r in usable if r.prefix in prefixes]
        return best_routes(usable)

    def _router_id(self, peer: Address) -> Address:
        """The peer's router id from its OPEN; Tabby nodes use their address anyway."""
        opened = self.opens.get(peer)
        return opened.router_id if opened is not None and opened.router_id else peer

    def _ibgp(self, peer: DesiredPeer) -> bool:
        return peer.as_number == self.local.as_number

    def _may_reflect(self, source: DesiredPeer, target: DesiredPeer, route: LearnedRoute) -> bool:
        if source.address == target.address or not self._ibgp(source):
            return False
        if target.address in (route.next_hop, route.originator_id):
            return False  # the target's own route
        return source.rr_client or target.rr_client

    def _replay(self, target: Address) -> list[str]:
        """A session came up: (re)send everything it should have, then End-of-RIB."""
        desired = self.desired_out(target)
        commands = _withdraws(target, self.sent.get(target, {}), desired)
        commands += [route.announce(target) for route in desired.values()]
        self._record(target, desired)
        return [*commands, f"neighbor {target} announce eor {FAMILY}"]

    def _sync_all(self) -> list[str]:
        best = self._best()
        return [c for a in sorted(self.peers, key=int) for c in self._sync(a, best)]

    def _sync(self, target: Address, best: Mapping[Network, LearnedRoute]) -> list[str]:
        """Commands that move what `target` has from us to what it should have."""
        desired = self.desired_out(target, best)
        sent = self.sent.get(target, {})
        commands = _withdraws(target, sent, desired)
        commands += [r.announce(target) for p, r in desired.items() if sent.get(p) != r]
        self._record(target, desired)
        return commands

    def _sync_prefixes(self, prefixes: Iterable[Network]) -> list[str]:
        """Like _sync_all, for the few prefixes an event touched (cheap with many peers)."""
        changed = sorted(set(prefixes))
        if not changed:
            return []
        best = self._best(set(changed))
        commands: list[str] = []
        for target in sorted(self.peers, key=int):
            sent = self.sent.setdefault(target, {})
            for prefix in changed:
                want = self._desired_for(target, prefix, best)
                if want == sent.get(prefix):
                    continue
                if want is None:
                    del sent[prefix]
                    commands.append(f"neighbor {target} withdraw route {prefix}")
                else:
                    sent[prefix] = want
                    self.ever_sent.setdefault(target, set()).add(prefix)
                    commands.append(want.announce(target))
        return commands

    def _record(self, target: Address, desired: dict[Network, OutRoute]) -> None:
        self.sent[target] = desired
        self.ever_sent.setdefault(target, set()).update(desired)


def _withdraws(
    target: Address, sent: dict[Network, OutRoute], desired: dict[Network, OutRoute]
) -> list[str]:
    return [f"neighbor {target} withdraw route {p}" for p in sorted(set(sent) - set(desired))]
