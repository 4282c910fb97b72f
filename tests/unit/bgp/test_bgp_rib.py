"""The speaker core: learned table, loop filters, replay on up, route reflection (pure)."""

from __future__ import annotations

import ipaddress

from bgp import annotations as ann
from bgp.config import BGPPlan, compute_plan
from bgp.messages import (
    EndOfRib,
    LearnedRoute,
    PeerOpen,
    RouteUpdate,
    Shutdown,
    StateChange,
    Unparsed,
)
from bgp.rib import SpeakerCore
from datastore.models import BGPConfiguration, BGPPeer

A = ipaddress.IPv4Address
N = ipaddress.IPv4Network


def node(name: str, address: str, **extra: str) -> dict:
    annotations = {ann.IPV4_ADDRESS: address, **{getattr(ann, k): v for k, v in extra.items()}}
    return {"metadata": {"name": name, "annotations": annotations}}


MESH_NODES = [node("n1", "10.0.0.1/24"), node("n2", "10.0.0.2/24"), node("n3", "10.0.0.3/24")]
RR_NODES = [
    node("rr", "10.0.0.10/24", RR_CLUSTER_ID="244.0.0.1"),
    node("rr2", "10.0.0.11/24", RR_CLUSTER_ID="244.0.0.1"),
    *MESH_NODES,
]
TOR = BGPPeer.model_validate(
    {"metadata": {"name": "tor"}, "spec": {"peerIP": "10.0.0.254", "asNumber": 65000}}
)


def plan(me: str, nodes: list[dict], peers: list[BGPPeer] | None = None) -> BGPPlan:
    cfg = BGPConfiguration.model_validate({"metadata": {"name": "default"}})
    result = compute_plan(cfg, nodes, peers or [], me)
    assert result is not None
    return result


def core_for(me: str, nodes: list[dict], peers: list[BGPPeer] | None = None) -> SpeakerCore:
    return SpeakerCore(plan(me, nodes, peers), clock=lambda: 1000.0)


def route(prefix: str, peer: str, next_hop: str | None = None, **attrs: object) -> LearnedRoute:
    return LearnedRoute(N(prefix), A(next_hop or peer), A(peer), **attrs)  # type: ignore[arg-type]


def up(core: SpeakerCore, peer: str) -> list[str]:
    return core.handle(StateChange(A(peer), "up", time=1001.0))


def announce(core: SpeakerCore, *routes: LearnedRoute) -> list[str]:
    return core.handle(RouteUpdate(routes[0].peer, announced=routes))


def test_up_replays_own_routes_then_eor() -> None:
    core = core_for("n1", MESH_NODES)
    first = core.set_origin([N("10.244.1.0/26")])
    assert first == [
        "neighbor 10.0.0.2 announce route 10.244.1.0/26 next-hop self",
        "neighbor 10.0.0.3 announce route 10.244.1.0/26 next-hop self",
    ]
    assert core.set_origin([N("10.244.1.0/26")]) == []  # nothing changed, nothing sent
    assert up(core, "10.0.0.2") == [
        "neighbor 10.0.0.2 announce route 10.244.1.0/26 next-hop self",
        "neighbor 10.0.0.2 announce eor ipv4 unicast",
    ]
    status = {s.address: s for s in core.peer_statuses()}
    assert (status["10.0.0.2"].state, status["10.0.0.2"].info, status["10.0.0.2"].since) == (
        "up",
        "Established",
        1001.0,
    )
    assert (status["10.0.0.3"].state, status["10.0.0.3"].info) == ("start", "Idle")
    assert (status["10.0.0.2"].sessions, status["10.0.0.3"].sessions) == (1, 0)


def test_withdraw_own_route_goes_to_every_peer() -> None:
    core = core_for("n1", MESH_NODES)
    core.set_origin([N("10.244.1.0/26"), N("10.244.1.64/26")])
    assert core.set_origin([N("10.244.1.64/26")]) == [
        "neighbor 10.0.0.2 withdraw route 10.244.1.0/26",
        "neighbor 10.0.0.3 withdraw route 10.244.1.0/26",
    ]


def test_learned_routes_follow_updates_and_die_with_the_peer() -> None:
    core = core_for("n1", MESH_NODES)
    up(core, "10.0.0.2")
    up(core, "10.0.0.3")
    announce(core, route("10.244.2.0/26", "10.0.0.2"), route("10.244.2.64/26", "10.0.0.2"))
    announce(core, route("10.244.3.0/26", "10.0.0.3"))
    assert [str(r.prefix) for r in core.learned_routes()] == [
        "10.244.2.0/26",
        "10.244.2.64/26",
        "10.244.3.0/26",
    ]
    core.handle(RouteUpdate(A("10.0.0.2"), withdrawn=(N("10.244.2.64/26"),)))
    assert core.status[A("10.0.0.2")].routes_received == 1
    core.handle(StateChange(A("10.0.0.3"), "down", reason="closing connection", time=1002.0))
    assert [str(r.prefix) for r in core.learned_routes()] == ["10.244.2.0/26"]
    status = core.status[A("10.0.0.3")]
    assert (status.state, status.info, status.since) == (
        "start",
        "Active: closing connection",
        1002.0,
    )
    # connected (a dial attempt) shows Connect while not established
    core.handle(StateChange(A("10.0.0.3"), "connected"))
    assert core.status[A("10.0.0.3")].info == "Connect"


def test_loops_and_echoes_are_dropped() -> None:
    core = core_for("rr", RR_NODES, [TOR])
    core.set_origin([N("10.244.10.0/26")])
    for peer in ("10.0.0.1", "10.0.0.254"):
        up(core, peer)
    announce(
        core,
        route("10.244.1.0/26", "10.0.0.1"),
        route("10.244.66.0/26", "10.0.0.1", originator_id=A("10.0.0.10")),
        route("10.244.67.0/26", "10.0.0.1", cluster_list=("244.0.0.1",)),
        route("10.244.10.0/26", "10.0.0.1"),  # our own block, echoed
        route("10.244.68.0/26", "10.0.0.1", next_hop="10.0.0.10"),  # via ourselves
    )
    announce(core, route("10.244.69.0/26", "10.0.0.254", as_path=(65000, 64512)))
    announce(core, route("172.16.0.0/16", "10.0.0.254", as_path=(65000,)))
    assert [str(r.prefix) for r in core.learned_routes()] == ["10.244.1.0/26", "172.16.0.0/16"]
    assert core.dropped == 5


def test_a_looped_reannouncement_replaces_the_old_route() -> None:
    core = core_for("n1", MESH_NODES)
    up(core, "10.0.0.2")
    announce(core, route("10.244.2.0/26", "10.0.0.2"))
    announce(core, route("10.244.2.0/26", "10.0.0.2", originator_id=A("10.0.0.1")))
    assert core.learned_routes() == []


def test_updates_from_unknown_peers_and_other_events_are_ignored() -> None:
    core = core_for("n1", MESH_NODES)
    assert announce(core, route("10.244.9.0/26", "10.0.0.9")) == []
    assert core.handle(StateChange(A("10.0.0.9"), "up")) == []
    assert core.handle(EndOfRib(A("10.0.0.2"))) == []
    assert core.handle(Unparsed("x", "y")) == []
    assert core.learned_routes() == []


def test_reflector_reflects_client_routes_with_originator_and_cluster_list() -> None:
    core = core_for("rr", RR_NODES, [TOR])
    for peer in ("10.0.0.1", "10.0.0.2", "10.0.0.11", "10.0.0.254"):
        up(core, peer)
    commands = announce(core, route("10.244.1.0/26", "10.0.0.1"))
    reflected = (
        "announce route 10.244.1.0/26 next-hop 10.0.0.1 originator-id 10.0.0.1 "
        "cluster-list [ 244.0.0.1 ]"
    )
    # to every iBGP peer but the source (clients and the non-client rr2), never to eBGP
    assert commands == [
        f"neighbor 10.0.0.2 {reflected}",
        f"neighbor 10.0.0.3 {reflected}",
        f"neighbor 10.0.0.11 {reflected}",
    ]
    # a non-client's (rr2's) route goes to clients only, keeping its cluster list
    commands = announce(
        core,
        route(
            "10.244.7.0/26",
            "10.0.0.11",
            next_hop="10.0.0.7",
            originator_id=A("10.0.0.7"),
            cluster_list=("244.0.0.9",),
        ),
    )
    tail = (
        "announce route 10.244.7.0/26 next-hop 10.0.0.7 originator-id 10.0.0.7 "
        "cluster-list [ 244.0.0.1 244.0.0.9 ]"
    )
    assert commands == [f"neighbor 10.0.0.{n} {tail}" for n in (1, 2, 3)]
    # eBGP routes are not re-advertised
    assert announce(core, route("172.16.0.0/16", "10.0.0.254", as_path=(65000,))) == []


def test_reflected_routes_are_withdrawn_when_the_source_goes_down() -> None:
    core = core_for("rr", RR_NODES)
    for peer in ("10.0.0.1", "10.0.0.2"):
        up(core, peer)
    announce(core, route("10.244.1.0/26", "10.0.0.1"))
    commands = core.handle(StateChange(A("10.0.0.1"), "down", reason="closing connection"))
    assert commands == [
        "neighbor 10.0.0.2 withdraw route 10.244.1.0/26",
        "neighbor 10.0.0.3 withdraw route 10.244.1.0/26",
        "neighbor 10.0.0.11 withdraw route 10.244.1.0/26",
    ]


def test_reflector_replays_reflected_routes_to_a_peer_coming_up() -> None:
    core = core_for("rr", RR_NODES)
    core.set_origin([N("10.244.10.0/26")])
    up(core, "10.0.0.1")
    announce(core, route("10.244.1.0/26", "10.0.0.1"))
    assert up(core, "10.0.0.2") == [
        "neighbor 10.0.0.2 announce route 10.244.1.0/26 next-hop 10.0.0.1 "
        "originator-id 10.0.0.1 cluster-list [ 244.0.0.1 ]",
        "neighbor 10.0.0.2 announce route 10.244.10.0/26 next-hop self",
        "neighbor 10.0.0.2 announce eor ipv4 unicast",
    ]


def test_plain_node_reflects_nothing() -> None:
    core = core_for("n1", MESH_NODES)
    up(core, "10.0.0.2")
    up(core, "10.0.0.3")
    assert announce(core, route("10.244.2.0/26", "10.0.0.2")) == []


def test_speaker_restart_and_resync() -> None:
    core = core_for("n1", MESH_NODES)
    core.set_origin([N("10.244.1.0/26"), N("10.244.1.64/26")])
    up(core, "10.0.0.2")
    announce(core, route("10.244.2.0/26", "10.0.0.2"))
    core.set_origin([N("10.244.1.0/26")])  # imagine these commands were lost
    assert core.resync() == [
        "neighbor 10.0.0.2 withdraw route 10.244.1.64/26",
        "neighbor 10.0.0.2 announce route 10.244.1.0/26 next-hop self",
        "neighbor 10.0.0.3 withdraw route 10.244.1.64/26",
        "neighbor 10.0.0.3 announce route 10.244.1.0/26 next-hop self",
    ]
    assert core.resync()[0] == "neighbor 10.0.0.2 announce route 10.244.1.0/26 next-hop self"
    core.handle(Shutdown())
    assert core.learned_routes() == []
    assert core.status[A("10.0.0.2")].info == "Active: speaker restarted"


def test_set_plan_forgets_removed_peers_and_tracks_new_ones() -> None:
    core = core_for("n1", MESH_NODES)
    core.set_origin([N("10.244.1.0/26")])
    up(core, "10.0.0.3")
    announce(core, route("10.244.3.0/26", "10.0.0.3"))
    nodes = [*MESH_NODES[:2], node("n4", "10.0.0.4/24")]
    commands = core.set_plan(plan("n1", nodes))
    assert commands == ["neighbor 10.0.0.4 announce route 10.244.1.0/26 next-hop self"]
    assert core.learned_routes() == []
    assert [s.address for s in core.peer_statuses()] == ["10.0.0.2", "10.0.0.4"]
    assert core.peer_statuses()[0].to_json()["type"] == "node-to-node mesh"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gr_core(restart: int | None = 120) -> tuple[SpeakerCore, Clock]:
    clock = Clock()
    core = SpeakerCore(plan("n1", MESH_NODES), clock=clock, startup_grace=60)
    for peer in ("10.0.0.2", "10.0.0.3"):
        core.handle(PeerOpen(A(peer), router_id=A(peer), restart_time=restart))
        up(core, peer)
    announce(core, route("10.244.2.0/26", "10.0.0.2"), route("10.244.2.64/26", "10.0.0.2"))
    return core, clock


def prefixes(core: SpeakerCore) -> list[str]:
    return [str(r.prefix) for r in core.learned_routes()]


def test_graceful_restart_keeps_stale_routes_until_eor() -> None:
    core, _ = gr_core()
    core.handle(StateChange(A("10.0.0.2"), "down", reason="closing connection"))
    assert prefixes(core) == ["10.244.2.0/26", "10.244.2.64/26"]  # stale, still used
    assert core.peer_statuses()[0].stale_routes == 2
    # a failed reconnect attempt changes nothing
    core.handle(StateChange(A("10.0.0.2"), "connected"))
    core.handle(StateChange(A("10.0.0.2"), "down", reason="closing connection"))
    assert len(core.learned_routes()) == 2
    up(core, "10.0.0.2")
    announce(core, route("10.244.2.0/26", "10.0.0.2"))  # re-announced: fresh again
    assert prefixes(core) == ["10.244.2.0/26", "10.244.2.64/26"]
    core.handle(EndOfRib(A("10.0.0.2")))  # the rest was not re-sent: gone
    assert prefixes(core) == ["10.244.2.0/26"]
    assert core.peer_statuses()[0].stale_routes == 0


def test_stale_routes_expire_at_the_restart_time_and_withdraws_apply_to_them() -> None:
    core, clock = gr_core(restart=30)
    core.handle(StateChange(A("10.0.0.2"), "down", reason="closing connection"))
    clock.now += 29
    assert core.tick() == (False, [])
    up(core, "10.0.0.2")
    core.handle(RouteUpdate(A("10.0.0.2"), withdrawn=(N("10.244.2.64/26"),)))
    assert prefixes(core) == ["10.244.2.0/26"]
    clock.now += 2
    changed, _ = core.tick()
    assert changed
    assert core.learned_routes() == []


def test_no_graceful_restart_after_a_notification_or_without_the_capability() -> None:
    core, _ = gr_core()
    core.handle(StateChange(A("10.0.0.2"), "down", reason="notification received (6,3)"))
    assert core.learned_routes() == []
    core, _ = gr_core(restart=None)
    core.handle(StateChange(A("10.0.0.2"), "down", reason="closing connection"))
    assert core.learned_routes() == []


def test_our_own_speaker_restart_keeps_gr_peers_routes() -> None:
    core, _ = gr_core()
    core.speaker_restarted()
    assert prefixes(core) == ["10.244.2.0/26", "10.244.2.64/26"]
    assert core.status[A("10.0.0.2")].state == "start"


def test_synced_after_every_peers_eor_or_the_startup_grace() -> None:
    core, clock = gr_core()
    assert not core.synced()
    core.handle(EndOfRib(A("10.0.0.2")))
    assert not core.synced()
    core.handle(EndOfRib(A("10.0.0.3")))
    assert core.synced()
    late, clock = gr_core()
    clock.now += 61
    assert late.synced()
    assert SpeakerCore(plan("n1", MESH_NODES[:1])).synced()  # no peers: nothing to wait for


def test_reflected_originator_comes_from_the_open_router_id() -> None:
    core = core_for("rr", RR_NODES)
    core.handle(PeerOpen(A("10.0.0.1"), router_id=A("1.1.1.1")))
    up(core, "10.0.0.1")
    up(core, "10.0.0.2")
    commands = announce(core, route("10.244.1.0/26", "10.0.0.1"))
    assert commands[0] == (
        "neighbor 10.0.0.2 announce route 10.244.1.0/26 next-hop 10.0.0.1 "
        "originator-id 1.1.1.1 cluster-list [ 244.0.0.1 ]"
    )


def test_reflector_with_fifty_clients_sends_each_route_to_every_other_client() -> None:
    nodes = [node("rr", "10.0.0.250/24", RR_CLUSTER_ID="244.0.0.1")]
    nodes += [node(f"n{i}", f"10.0.0.{i + 1}/24") for i in range(50)]
    core = core_for("rr", nodes)
    peers = [p.address for p in plan("rr", nodes).peers]
    commands = [c for p in peers for c in up(core, str(p))]
    for i, peer in enumerate(peers):
        commands += announce(core, route(f"10.244.{i}.0/26", str(peer)))
    assert sum("announce eor" in c for c in commands) == 50
    assert sum("originator-id" in c for c in commands) == 50 * 49
    # one client dies (no GR): its route is withdrawn from the 49 others, nothing else moves
    gone = core.handle(StateChange(peers[7], "down", reason="closing connection"))
    assert gone == [f"neighbor {p} withdraw route 10.244.7.0/26" for p in peers if p != peers[7]]
