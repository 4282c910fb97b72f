"""The agent's policy pass from informer caches: changed objects only, same answer."""

from __future__ import annotations

from typing import Any

from felix.managers import PolicyManager, PolicySources, drive
from felix.policy_dataplane import ChainRules
from felix.policy_sync import PolicySync, WiredEndpoint
from policy import desired_state, parse_namespace, parse_policy
from policy.cluster_compiler import parse_node
from policy.cluster_policy import parse_cluster_policy
from policy.membership import AddressBook, local_address, trusted_pod
from policy.realization import Version
from policy.rules import Chain, Rule
from tests.unit.policy.policy_world import np_dict, ns_dict, pod_dict


class FakeCache:
    """An informer's cache: objects by key, and how often the pass read one."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = {_key(o): o for o in objects}
        self.reads = 0

    def get(self, key: str) -> dict[str, Any] | None:
        self.reads += 1
        return self.objects.get(key)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        self.reads += len(self.objects)
        return dict(self.objects)


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


def world(pods: int) -> dict[str, FakeCache]:
    allow_a = {"from": [{"podSelector": {"matchLabels": {"role": "a"}}}]}
    return {
        "pods": FakeCache(
            [
                pod_dict("x", f"p{i}", f"10.0.{i // 200}.{i % 200 + 1}", {"role": "a"})
                for i in range(pods)
            ]
        ),
        "namespaces": FakeCache([ns_dict("x")]),
        "policies": FakeCache([np_dict("x", "web", {"podSelector": {}, "ingress": [allow_a]})]),
    }


def wired(*names: str) -> dict[str, WiredEndpoint]:
    return {
        f"cali{name}": WiredEndpoint("x", name, local_address(f"10.9.0.{i + 1}"))
        for i, name in enumerate(names)
    }


def no_fetch(_namespace: str, _name: str) -> None:
    raise AssertionError("the pod is in the cache; nothing to fetch")


def from_scratch(caches: dict[str, FakeCache], endpoints: dict[str, WiredEndpoint]):
    book = AddressBook()
    local_addr = {(e.namespace, e.pod): e.address for e in endpoints.values()}
    pods = {
        k: trusted_pod(o, book, local_addr.get(tuple(k.split("/"))))
        for k, o in caches["pods"].objects.items()
    }
    local = {i: pods[f"{e.namespace}/{e.pod}"] for i, e in endpoints.items()}
    cluster = caches.get("clusterpolicies")
    nodes = caches.get("nodes")
    return desired_state(
        [parse_policy(o) for o in caches["policies"].objects.values()],
        pods.values(),
        [parse_namespace(o) for o in caches["namespaces"].objects.values()],
        local,
        cluster_policies=[parse_cluster_policy(o) for o in cluster.objects.values()]
        if cluster
        else (),
        nodes=[parse_node(o) for o in nodes.objects.values()] if nodes else (),
    )


def test_a_new_pod_costs_one_read_not_the_cluster() -> None:
    caches = world(pods=300)
    sync = PolicySync("ACCEPT")
    sync.compute(caches, wired("p0"), AddressBook, no_fetch)
    assert caches["pods"].reads >= 300  # the first pass reads everything
    for cache in caches.values():
        cache.reads = 0
    new = pod_dict("x", "p300", "10.0.9.9", {"role": "b"})
    caches["pods"].objects["x/p300"] = new
    sync.changed.note("pods", "x/p300")
    endpoints = wired("p0", "p300")
    state, local = sync.compute(caches, endpoints, AddressBook, no_fetch)
    assert caches["pods"].reads == 1
    assert set(local) == {"calip0", "calip300"}
    expected = from_scratch(caches, endpoints)
    assert dict(state.chains) == dict(expected.chains)
    assert dict(state.members) == dict(expected.members)


def test_a_wired_pod_the_cache_has_not_seen_is_fetched() -> None:
    caches = world(pods=2)
    late = pod_dict("x", "late", "10.0.5.5", {"role": "a"})
    fetched: list[tuple[str, str]] = []

    def fetch(namespace: str, name: str) -> dict[str, Any] | None:
        fetched.append((namespace, name))
        return late if name == "late" else None

    sync = PolicySync("ACCEPT")
    _, local = sync.compute(caches, wired("p0", "late", "gone"), AddressBook, fetch)
    assert sorted(fetched) == [("x", "gone"), ("x", "late")]
    assert set(local) == {"calip0", "calilate"}  # the pod nobody knows fails closed
    assert [str(ip) for ip in local["calilate"].ips] == ["10.9.0.2"]  # the wired address


def test_an_invalid_policy_is_counted_once_and_left_out() -> None:
    caches = world(pods=2)
    bad = np_dict("x", "bad", {"podSelector": {"matchLabels": {"a": 5}}})
    caches["policies"].objects["x/bad"] = bad
    invalid: list[int] = []
    sync = PolicySync("ACCEPT", on_invalid=lambda: invalid.append(1))
    sync.compute(caches, wired("p0"), AddressBook, no_fetch)
    sync.compute(caches, wired("p0"), AddressBook, no_fetch)
    assert len(invalid) == 1
    sync.compute(caches, wired("p0"), AddressBook, no_fetch, afresh=True)
    assert len(invalid) == 2  # the resync starts afresh and meets it again


def test_chain_rules_convert_a_chain_object_once() -> None:
    convert = ChainRules()
    a = Chain("cali-pi-_a", (Rule(("-p", "tcp"), "RETURN"),))
    first = convert({a.name: a})[a.name]
    assert convert({a.name: a})[a.name] is first
    changed = Chain("cali-pi-_a", (Rule(("-p", "udp"), "RETURN"),))
    assert convert({a.name: changed})[a.name] != first
    assert convert({}) == {}
    assert convert({a.name: a})[a.name] == first and convert({a.name: a})[a.name] is not first


def test_cluster_policies_and_nodes_reach_the_calculation() -> None:
    """A ClusterNetworkPolicy and a Node change, noted like any informer's, change the
    answer as the from-scratch computation with them would."""
    caches = world(pods=3)
    caches["clusterpolicies"] = FakeCache([])
    caches["nodes"] = FakeCache([node("n1", "10.9.9.9", {"role": "cp"})])
    sync = PolicySync("ACCEPT")
    endpoints = wired("p0", "p1")
    sync.compute(caches, endpoints, AddressBook, no_fetch)
    to_cp = [{"nodes": {"matchLabels": {"role": "cp"}}}]
    deny_cp = {
        "metadata": {"name": "no-cp"},
        "spec": {"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                 "egress": [{"action": "Deny", "to": to_cp}]},
    }  # fmt: skip
    caches["clusterpolicies"].objects["no-cp"] = deny_cp
    sync.changed.note("clusterpolicies", "no-cp")
    state, _ = sync.compute(caches, endpoints, AddressBook, no_fetch)
    expected = from_scratch(caches, endpoints)
    assert dict(state.chains) == dict(expected.chains)
    assert dict(state.members) == dict(expected.members)
    assert ["10.9.9.9/32"] in [sorted(m) for m in state.members.values()]
    caches["nodes"].objects["n2"] = node("n2", "10.9.9.10", {"role": "cp"})
    sync.changed.note("nodes", "n2")
    state, _ = sync.compute(caches, endpoints, AddressBook, no_fetch)
    assert ["10.9.9.10/32", "10.9.9.9/32"] in [sorted(m) for m in state.members.values()]
    assert dict(state.chains) == dict(from_scratch(caches, endpoints).chains)


def node(name: str, ip: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]}}  # fmt: skip


def test_programmed_names_each_valid_policys_version_and_where_it_applies() -> None:
    caches = world(pods=2)
    caches["policies"].objects["x/web"]["metadata"].update(generation=3, uid="aaaaaaaa-1")
    other = np_dict("y", "elsewhere", {"podSelector": {}})  # selects no local pod
    other["metadata"].update(generation=1, uid="bbbbbbbb-2")
    bad = np_dict("x", "bad", {"podSelector": {"matchLabels": {"a": 5}}})
    caches["policies"].objects.update({"y/elsewhere": other, "x/bad": bad})
    sync = PolicySync("ACCEPT")
    sync.compute(caches, wired("p0"), AddressBook, no_fetch)
    versions, applied = sync.programmed()
    assert versions == {
        "np/x/web": Version(3, "aaaaaaaa"),
        "np/y/elsewhere": Version(1, "bbbbbbbb"),
    }  # the invalid policy is not programmed
    assert applied == {"np/x/web"}
    # A change is reported once the pass that reads it has run, not before.
    caches["policies"].objects["x/web"]["metadata"]["generation"] = 4
    assert sync.programmed()[0]["np/x/web"] == Version(3, "aaaaaaaa")
    sync.changed.note("policies", "x/web")
    sync.compute(caches, wired("p0"), AddressBook, no_fetch)
    assert sync.programmed()[0]["np/x/web"] == Version(4, "aaaaaaaa")
    del caches["policies"].objects["x/web"]
    sync.changed.note("policies", "x/web")
    sync.compute(caches, wired("p0"), AddressBook, no_fetch)
    assert sync.programmed() == ({"np/y/elsewhere": Version(1, "bbbbbbbb")}, frozenset())


class NoKernel:
    """A policy dataplane that takes every write and keeps nothing."""

    def apply_state(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    def apply_changes(self, *_args: Any, **_kwargs: Any) -> None:
        return None


def test_the_report_is_offered_only_when_it_may_have_changed() -> None:
    """The ADD path: a pass that changes no policy version and no policy's use offers
    nothing (rebuilding the report costs O(policies) on every pass)."""
    caches = world(pods=3)
    endpoints = wired("p0")
    offered: list[tuple[dict[str, Version], frozenset[str]]] = []
    manager = PolicyManager(
        PolicySync("ACCEPT"),
        NoKernel(),  # type: ignore[arg-type]
        PolicySources(caches, lambda: endpoints, AddressBook, no_fetch, lambda: []),
        lambda versions, applied: offered.append((versions, applied)),
    )
    drive(manager, resync=False)
    assert len(offered) == 1 and offered[0][1] == {"np/x/web"}
    endpoints = wired("p0", "p1")  # another pod the same policy selects: same report
    manager.calculation.changed.note("pods", "x/p1")
    drive(manager, resync=False)
    assert len(offered) == 1
    caches["policies"].objects["x/web"]["metadata"]["generation"] = 2
    manager.calculation.changed.note("policies", "x/web")
    drive(manager, resync=False)
    assert len(offered) == 2 and offered[1][0]["np/x/web"].generation == 2
    drive(manager, resync=True)  # afresh: a new calculation, offered again
    assert len(offered) == 3 and offered[2] == offered[1]
