"""NetworkPolicy at scale: apply latency, incremental bytes, and throughput cost.

Standalone, as root: ``.venv/bin/python tests/bench/policy_scale.py``. It measures

1. **Policy change → enforcement** on one node with 1,000 local pods and 500
   NetworkPolicies. The world is synthetic and built in Python (pods spread
   over 20 namespaces with app/tier/version labels and named container ports;
   policies mixing pod selectors, namespace selectors, matchExpressions,
   ipBlocks with excepts, numeric ports, port ranges and named ports; every
   object goes through the real parsers). One fresh network namespace
   (``tbt-<random>``) plays the node: the chains only name interfaces, so no
   veths are needed. ``PolicyDataplane`` writes the full state through
   ``SubprocessRunner(netns=...)``, then N incremental changes are made in
   rotation (change one policy's port, relabel one pod so selector ipsets and
   its endpoint chain change, add a policy, remove it again) and each
   ``apply()`` is timed end to end (compile, then the typed messages from the
   state written last, as the agent's policy manager writes them, and the
   ipset/iptables writes). Reported: p50 and p99 in ms (nearest-rank). Then the
   same number of ClusterNetworkPolicy changes on that node (20 exist first; in
   rotation one is added, one's port edited, one deleted; each on one team
   namespace, Admin or Baseline, Deny, Pass or Accept from a team on one port):
   ``cnp_apply_p99_ms``, to hold against a NetworkPolicy change's.
2. **Bytes per incremental change versus a full write**: full = bytes of the
   first apply into the empty namespace (every ipset and chain), also checked
   by a forced rewrite (``resync`` after flushing the namespace's filter table
   and ipsets) of the final state. ``incremental_bytes_ratio`` = mean bytes of
   the incremental applies / full bytes.
3. **Throughput cost of policy**: a real 2-node ``LabCluster`` (real agents,
   BGP routes between node namespaces). A server pod on node2, a client pod on
   node1; ``iperf3 -s`` in the server's pod namespace, ``iperf3 -c -t 5 -J``
   in the client's. First with no policy at all; then 200 NetworkPolicies
   that select the server (each allowing the client on port 5201 plus one
   other port) are applied through the apiserver and awaited in node2's
   ``iptables-save``; then runs alternate with and without them (the server's
   ``role`` label deselects all 200, so the node compiles none, and selects
   them again), 3 runs each, so load drift on a shared machine hits both
   sides. ``throughput_ratio`` = median with / median without (the ratio of
   means is printed too). Only a connection's first packet walks the policy
   chains; the rest are accepted by the conntrack rule at the top of the
   endpoint chain, as in Calico. The packets that entered a policy chain are
   counted and printed to show it.

4. **Growth with the cluster**: one node with 100 local pods and 2,000 policies in
   clusters of 1,000, 2,500, 5,000 and 10,000 pods (the others on other nodes:
   they fill the node's ipsets). The same kinds of change as in part 1, plus a
   remote pod's relabel that moves it into or out of a set the node uses. A
   one-pod change should cost the same at every size; p50, p99 and the median per
   kind are printed per size. ``cluster_apply_p99_ms`` is the 10,000-pod p99.
5. **The agent's memory**: a 1-node ``LabCluster`` whose real ``tabby-node``
   watches 10,000 pods bound to other nodes (with the status kubelet writes) and
   2,000 policies, written through the apiserver, plus 20 pods wired on the node
   by CNI ADD. Once every ipset the node must hold (computed here by
   ``felix.calc`` from what the apiserver lists) is in the node's kernel with
   exactly the expected members, the agent's VmRSS is read (``agent_rss_mib``);
   then the agent is restarted (its first list holds every pod at once), and its
   RSS and peak are printed again once every set is programmed again.

Everything created (namespaces, the labs, iperf3) is removed at the end, also on
failure or SIGTERM. The last line printed is exactly (one line)::

    policy apply_p99_ms=X incremental_bytes_ratio=Y throughput_ratio=Z
        cluster_apply_p99_ms=C agent_rss_mib=R cnp_apply_p99_ms=P
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import ipaddress
import json
import math
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from felix.calc import PolicyCalculator  # noqa: E402
from felix.calc.messages import changes  # noqa: E402
from felix.dataplane.backend import detect_backend  # noqa: E402
from felix.dataplane.ipsets import normalize_members, parse_ipset_save  # noqa: E402
from felix.dataplane.runner import SubprocessRunner  # noqa: E402
from felix.policy_dataplane import PolicyDataplane, render  # noqa: E402
from lab.cluster import ClusterSpec, LabCluster  # noqa: E402
from policy import (  # noqa: E402
    DesiredState,
    IPSetSpec,
    Namespace,
    NetSet,
    NetworkPolicy,
    Pod,
    desired_state,
    parse_namespace,
    parse_pod,
    parse_policy,
)
from policy.cluster_policy import parse_cluster_policy  # noqa: E402
from policy.naming import policy_chain_name  # noqa: E402

N_NAMESPACES = 20
APPS = [f"app{i:02d}" for i in range(25)]
TIERS = ["web", "api", "db", "cache"]
TEAMS = ["red", "green", "blue", "gold"]
IPERF_PORT = 5201
PROGRAMMED_TIMEOUT_S = 180.0

Obj = dict[str, Any]


# ---------------------------------------------------------------- the synthetic world


def _ns_name(i: int) -> str:
    return f"team-{i:02d}"


def _iface(namespace: str, name: str) -> str:
    return "cali" + hashlib.sha1(f"{namespace}.{name}".encode()).hexdigest()[:11]


def namespace_obj(i: int) -> Obj:
    labels = {"team": TEAMS[i % len(TEAMS)], "env": "prod" if i % 3 else "dev"}
    return {"metadata": {"name": _ns_name(i), "labels": labels}}


def pod_obj(i: int, rng: random.Random, base: str = "10.244.0.0") -> Obj:
    """Pod i: a namespace, labels, one /32 in base/16, named ports on most pods."""
    ports = [{"name": "http", "containerPort": 8080}]
    if i % 3 == 0:
        ports.append({"name": "metrics", "containerPort": 9090})
    if i % 7 == 0:
        ports.append({"name": "dns", "containerPort": 53, "protocol": "UDP"})
    labels = {
        "app": rng.choice(APPS),
        "tier": rng.choice(TIERS),
        "version": rng.choice(["v1", "v2"]),
    }
    ip = ipaddress.IPv4Address(base) + 2 + i
    return {
        "metadata": {
            "name": f"pod-{i:04d}",
            "namespace": _ns_name(i % N_NAMESPACES),
            "labels": labels,
        },
        "spec": {"containers": [{"name": "main", "ports": ports}]},
        "status": {"phase": "Running", "podIP": str(ip), "podIPs": [{"ip": str(ip)}]},
    }


CNP_SEEDED = 20  # ClusterNetworkPolicies that exist before the timed CNP changes


def cluster_policy_obj(i: int, port_bump: int = 0) -> Obj:
    """ClusterNetworkPolicy i, deterministic in ``i``: Admin or Baseline, on one team
    namespace, one rule (Deny, Pass or Accept) from the namespaces of one team on one
    TCP port; another ``port_bump`` changes only that port."""
    rng = random.Random(200_000 + i)
    namespace = _ns_name(rng.randrange(N_NAMESPACES))
    subject = {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    rule = {
        "action": ("Deny", "Pass", "Accept")[i % 3],
        "from": [{"namespaces": {"matchLabels": {"team": rng.choice(TEAMS)}}}],
        "protocols": [{"tcp": {"destinationPort": {"number": 2000 + i % 3000 + port_bump}}}],
    }
    spec = {"tier": ("Admin", "Baseline")[i % 2], "priority": i % 50, "subject": subject,
            "ingress": [rule]}  # fmt: skip
    return {"metadata": {"name": f"cnp-{i:04d}"}, "spec": spec}


def cluster_change(world: World, step: int) -> str:
    """One ClusterNetworkPolicy change, three kinds in rotation: add, edit a port, delete."""
    kind = step % 3
    if kind == 0:
        index = CNP_SEEDED + step
        world.set_cluster_policy(cluster_policy_obj(index))
        return f"add cnp-{index:04d}"
    name = sorted(world.cluster)[step % len(world.cluster)]
    if kind == 1:
        world.set_cluster_policy(cluster_policy_obj(int(name[4:]), port_bump=step + 1))
        return f"port of {name}"
    world.remove_cluster_policy(name)
    return f"remove {name}"


def policy_obj(i: int, port_bump: int = 0) -> Obj:
    """Policy i: one of six shapes, so the set mixes every kind of peer and port.

    Deterministic in ``i``: the same i with another ``port_bump`` differs only in
    its first port.
    """
    rng = random.Random(100_000 + i)
    namespace = _ns_name(i % N_NAMESPACES)
    app = rng.choice(APPS)
    port = 1000 + (i * 7) % 5000 + port_bump
    shape = i % 6
    spec: Obj
    if shape == 0:  # same-namespace pods by label, numeric port
        spec = {
            "podSelector": {"matchLabels": {"app": app}},
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"tier": rng.choice(TIERS)}}}],
                    "ports": [{"port": port}],
                }
            ],
        }
    elif shape == 1:  # other namespaces by label, named port
        spec = {
            "podSelector": {"matchLabels": {"tier": rng.choice(TIERS)}},
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {"team": rng.choice(TEAMS)}},
                            "podSelector": {"matchLabels": {"tier": "web"}},
                        }
                    ],
                    "ports": [{"port": "http"}, {"port": port}],
                }
            ],
        }
    elif shape == 2:  # ipBlock with excepts, two protocols
        spec = {
            "podSelector": {"matchLabels": {"app": app}},
            "ingress": [
                {
                    "from": [
                        {
                            "ipBlock": {
                                "cidr": f"10.{i % 200}.0.0/16",
                                "except": [f"10.{i % 200}.1.0/24"],
                            }
                        },
                        {"ipBlock": {"cidr": f"192.168.{i % 250}.0/24"}},
                    ],
                    "ports": [{"port": port}, {"protocol": "UDP", "port": 53}],
                }
            ],
        }
    elif shape == 3:  # egress to prod namespaces, port range
        spec = {
            "podSelector": {"matchLabels": {"app": app}},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [{"namespaceSelector": {"matchLabels": {"env": "prod"}}}],
                    "ports": [{"port": port, "endPort": port + 100}],
                },
                {"ports": [{"protocol": "UDP", "port": 53}]},
            ],
        }
    elif shape == 4:  # matchExpressions, both directions, named ports
        spec = {
            "podSelector": {
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["web", "api"]},
                    {"key": "app", "operator": "In", "values": [app, rng.choice(APPS)]},
                ]
            },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app": rng.choice(APPS)}}}],
                    "ports": [{"port": "metrics"}],
                }
            ],
            "egress": [
                {
                    "to": [{"podSelector": {"matchLabels": {"tier": "db"}}}],
                    "ports": [{"port": port}],
                }
            ],
        }
    else:  # all namespaces + version, and a default-deny-ish narrow allow
        spec = {
            "podSelector": {"matchLabels": {"app": app, "version": rng.choice(["v1", "v2"])}},
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": {"app": rng.choice(APPS)}},
                        },
                        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}},
                    ],
                    "ports": [{"port": port}, {"port": "http"}],
                }
            ],
        }
    return {"metadata": {"name": f"pol-{i:03d}", "namespace": namespace}, "spec": spec}


@dataclass
class World:
    """Parsed objects of one node; changed in place by the incremental steps."""

    namespaces: list[Namespace]
    pods: dict[str, Pod]
    pod_objs: dict[str, Obj]
    policies: dict[str, NetworkPolicy]
    local: dict[str, Pod] = field(default_factory=dict)
    cluster: dict[str, Obj] = field(default_factory=dict)  # ClusterNetworkPolicies
    added: list[str] = field(default_factory=list)
    # The set specs of the last apply: what a remote pod's change can reach.
    active_sets: dict[str, IPSetSpec] = field(default_factory=dict)
    # The agent's calculation layer, fed each change as its informers feed it.
    calc: PolicyCalculator = field(default_factory=PolicyCalculator)

    @classmethod
    def build(
        cls, n_pods: int, n_policies: int, n_local: int | None = None, seed: int = 7
    ) -> World:
        """The cluster; ``n_local`` pods (default: all), a seeded sample, are wired on
        the node."""
        rng = random.Random(seed)
        namespaces = [parse_namespace(namespace_obj(i)) for i in range(N_NAMESPACES)]
        pod_objs = {}
        for i in range(n_pods):
            obj = pod_obj(i, rng)
            pod_objs[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = obj
        pods = {key: parse_pod(obj) for key, obj in pod_objs.items()}
        policies = {}
        for i in range(n_policies):
            policy = parse_policy(policy_obj(i))
            policies[policy.key] = policy
        world = cls(namespaces, pods, pod_objs, policies)
        chosen = list(pods.values())
        if n_local is not None and n_local < n_pods:
            chosen = random.Random(seed + 1).sample(chosen, n_local)
        world.local = {_iface(p.namespace, p.name): p for p in chosen}
        for namespace in namespaces:
            world.calc.update_namespace(namespace.name, namespace)
        for pod in pods.values():
            world.calc.update_pod((pod.namespace, pod.name), pod)
        for key, policy in policies.items():
            world.calc.update_policy(key, policy)
        for iface, pod in world.local.items():
            world.calc.update_endpoint(iface, (pod.namespace, pod.name))
        return world

    def set_pod(self, key: str, obj: Obj) -> None:
        pod = parse_pod(obj)
        self.pod_objs[key], self.pods[key] = obj, pod
        iface = _iface(pod.namespace, pod.name)
        if iface in self.local:
            self.local[iface] = pod
        self.calc.update_pod((pod.namespace, pod.name), pod)

    def is_local(self, key: str) -> bool:
        namespace, name = key.split("/", 1)
        return _iface(namespace, name) in self.local

    def ns_labels(self) -> dict[str, Mapping[str, str]]:
        return {namespace.name: namespace.labels for namespace in self.namespaces}

    def set_policy(self, policy: NetworkPolicy) -> None:
        self.policies[policy.key] = policy
        self.calc.update_policy(policy.key, policy)

    def remove_policy(self, key: str) -> None:
        del self.policies[key]
        self.calc.update_policy(key, None)

    def set_cluster_policy(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        self.cluster[name] = obj
        self.calc.update_cluster_policy(name, parse_cluster_policy(obj))

    def remove_cluster_policy(self, name: str) -> None:
        del self.cluster[name]
        self.calc.update_cluster_policy(name, None)


def apply(dp: PolicyDataplane, world: World, *, resync: bool = False) -> tuple[float, int]:
    """One timed apply as the agent's policy manager does it (the calculation's state,
    then the typed messages from the state written last, or the whole state on the
    first apply and on a resync): seconds and bytes written."""
    start = time.perf_counter()
    state = world.calc.desired()
    written = WRITTEN.get(dp)
    if written is None or resync:
        dp.apply_state(state, world.calc.local_pods(), resync=resync)
    else:
        dp.apply_changes(changes(written, state), world.calc.local_pods())
    WRITTEN[dp] = state
    elapsed = time.perf_counter() - start
    world.active_sets = dict(state.ipsets)
    return elapsed, dp.last_bytes


# per dataplane: the state it was last brought to (what the agent's policy manager keeps)
WRITTEN: weakref.WeakKeyDictionary[PolicyDataplane, DesiredState] = weakref.WeakKeyDictionary()


def _selects_local(world: World, policy: NetworkPolicy) -> bool:
    return any(policy.selects(pod) for pod in world.local.values())


def _selecting(world: World, pod: Pod) -> set[str]:
    return {key for key, policy in world.policies.items() if policy.selects(pod)}


def _reaches_node(world: World, old: Pod, new: Pod) -> bool:
    """Does a remote pod's change move it into or out of a set this node uses?"""
    labels = world.ns_labels()
    for spec in world.active_sets.values():
        if isinstance(spec, NetSet):
            continue
        scope = spec.selection.namespace
        if scope is not None and scope != new.namespace:
            continue
        if spec.members((old,), labels) != spec.members((new,), labels):
            return True
    return False


def _relabel(world: World, rng: random.Random, *, local: bool) -> str:
    """Give one pod other app/tier labels, chosen so that the node must act on it:
    a local pod's set of selecting policies changes, a remote pod enters or leaves
    a set the node uses."""
    keys = sorted(k for k in world.pod_objs if world.is_local(k) == local)
    while True:
        key = rng.choice(keys)
        obj = json.loads(json.dumps(world.pod_objs[key]))
        obj["metadata"]["labels"]["app"] = rng.choice(APPS)
        obj["metadata"]["labels"]["tier"] = rng.choice(TIERS)
        new, old = parse_pod(obj), world.pods[key]
        if local and _selecting(world, new) != _selecting(world, old):
            break
        if not local and _reaches_node(world, old, new):
            break
    world.set_pod(key, obj)
    return f"labels of {key}" + ("" if local else " (remote)")


def change(world: World, step: int, rng: random.Random, n_policies: int) -> str:
    """One incremental change, four kinds in rotation (five when some pods are on
    other nodes: a remote pod's relabel); returns what it did.

    Every change is one the node must act on (a policy that selects a local pod,
    a relabel that changes which policies select the pod or which of the node's
    sets hold it), so no step is a free no-op that would flatter the figures.
    """
    kinds = 5 if len(world.local) < len(world.pods) else 4
    kind = step % kinds
    if kind == 4:
        return _relabel(world, rng, local=False)
    if kind == 0:  # one policy's port changes
        while True:
            i = rng.randrange(n_policies)
            policy = parse_policy(policy_obj(i, port_bump=step + 1))
            if _selects_local(world, policy):
                break
        world.set_policy(policy)
        return f"port of {policy.key}"
    if kind == 1:  # a local pod gets other app/tier labels: ipsets + its endpoint chains
        return _relabel(world, rng, local=True)
    if kind == 2:  # a new policy
        candidate = n_policies + step * 101
        while True:
            policy = parse_policy(policy_obj(candidate))
            if _selects_local(world, policy):
                break
            candidate += 1
        world.set_policy(policy)
        world.added.append(policy.key)
        return f"add {policy.key}"
    key = world.added.pop()
    world.remove_policy(key)
    return f"remove {key}"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@contextlib.contextmanager
def fresh_netns(label: str) -> Iterator[str]:
    name = f"tbt-{secrets.token_hex(3)}-{label}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=30)


def count_kernel(ns: str, backend_save: list[str]) -> tuple[int, int, int]:
    """(chains, rules, ipset members) Tabby has in namespace ns."""
    save = subprocess.run(
        ["ip", "netns", "exec", ns, *backend_save, "-t", "filter"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    chains = sum(1 for line in save.splitlines() if line.startswith(":cali-"))
    rules = sum(1 for line in save.splitlines() if line.startswith("-A cali-"))
    sets = subprocess.run(
        ["ip", "netns", "exec", ns, "ipset", "save"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    members = sum(1 for line in sets.splitlines() if line.startswith("add cali4"))
    return chains, rules, members


def bench_apply(
    n_pods: int, n_policies: int, n_changes: int, n_local: int | None = None
) -> tuple[float, float, float]:
    """Parts 1 and 2: returns (apply p99 ms, incremental bytes ratio, CNP apply p99 ms)."""
    t0 = time.perf_counter()
    world = World.build(n_pods, n_policies, n_local)
    print(
        f"world: {len(world.pods)} pods ({len(world.local)} on this node) in "
        f"{N_NAMESPACES} namespaces, {len(world.policies)} policies "
        f"(built and parsed in {time.perf_counter() - t0:.1f} s)"
    )
    with fresh_netns("node") as ns:
        dp = PolicyDataplane(SubprocessRunner(netns=ns), "auto")
        print(f"node namespace {ns}, iptables backend {dp.backend.name}")
        full_s, full_bytes = apply(dp, world)
        chains, rules, members = count_kernel(ns, list(dp.backend.save))
        print(
            f"full apply: {full_s * 1000:.0f} ms, {full_bytes} bytes "
            f"({chains} chains, {rules} rules, {members} ipset members)"
        )
        noop_s, noop_bytes = apply(dp, world)
        print(f"no-change apply: {noop_s * 1000:.0f} ms, {noop_bytes} bytes")

        rng = random.Random(99)
        times: list[float] = []
        sizes: list[int] = []
        for step in range(n_changes):
            what = change(world, step, rng, n_policies)
            seconds, written = apply(dp, world)
            times.append(seconds)
            sizes.append(written)
            print(f"  change {step + 1:2d}: {seconds * 1000:7.0f} ms {written:7d} B  {what}")
        cnp_times = _cluster_changes(dp, world, n_changes)

        # Compute alone (no kernel), to split the apply time: compile, then render.
        compile_s, render_s = [], []
        for _ in range(3):
            start = time.perf_counter()
            state = desired_state(
                world.policies.values(), world.pods.values(), world.namespaces, world.local
            )
            middle = time.perf_counter()
            render(state, world.local, "ACCEPT")
            compile_s.append(middle - start)
            render_s.append(time.perf_counter() - middle)

        # A forced full rewrite of the final state: flush what we wrote, then resync.
        cli = "iptables-nft" if dp.backend.name == "nft" else "iptables-legacy"
        for argv in (
            [cli, "-F"],
            [cli, "-X"],
            [cli, "-t", "nat", "-F"],
            [cli, "-t", "nat", "-X"],
            ["ipset", "destroy"],
        ):
            subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, timeout=60)
        rewrite_s, rewrite_bytes = apply(dp, world, resync=True)
        print(f"forced full rewrite (flush + resync): {rewrite_s * 1000:.0f} ms, {rewrite_bytes} B")

    p50, p99 = percentile(times, 50) * 1000, percentile(times, 99) * 1000
    mean_bytes = statistics.fmean(sizes)
    ratio = mean_bytes / full_bytes
    print(
        f"incremental apply (n={len(times)}): p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
        f"max {max(times) * 1000:.0f} ms"
    )
    print(
        f"  for comparison (no kernel, median of 3): desired_state from scratch "
        f"{statistics.median(compile_s) * 1000:.0f} ms + render "
        f"{statistics.median(render_s) * 1000:.0f} ms, what every pass computed before "
        f"the agent kept its calculation (felix.calc)"
    )
    print(
        f"incremental bytes: mean {mean_bytes:.0f} B, max {max(sizes)} B; "
        f"full {full_bytes} B (rewrite {rewrite_bytes} B); ratio {ratio:.4f}"
    )
    cnp_p50, cnp_p99 = (percentile(cnp_times, q) * 1000 for q in (50, 99))
    print(
        f"ClusterNetworkPolicy changes (n={len(cnp_times)}): p50 {cnp_p50:.0f} ms, "
        f"p99 {cnp_p99:.0f} ms (NetworkPolicy and pod changes above: p50 {p50:.0f}, "
        f"p99 {p99:.0f} ms)"
    )
    return p99, ratio, cnp_p99


def _cluster_changes(dp: PolicyDataplane, world: World, n_changes: int) -> list[float]:
    """CNP_SEEDED ClusterNetworkPolicies applied at once, then n_changes timed ones."""
    for i in range(CNP_SEEDED):
        world.set_cluster_policy(cluster_policy_obj(i))
    seeded_s, _ = apply(dp, world)
    print(f"{CNP_SEEDED} ClusterNetworkPolicies at once: {seeded_s * 1000:.0f} ms")
    times = []
    for step in range(n_changes):
        what = cluster_change(world, step)
        seconds, written = apply(dp, world)
        times.append(seconds)
        print(f"  cnp change {step + 1:2d}: {seconds * 1000:7.0f} ms {written:7d} B  {what}")
    return times


@dataclass
class GrowthRow:
    pods: int
    full_ms: float
    members: int
    p50_ms: float
    p99_ms: float
    by_kind: dict[str, float]  # median ms per kind of change


def _kind(what: str) -> str:
    if what.startswith("labels of"):
        return "remote relabel" if what.endswith("(remote)") else "local relabel"
    return what.split(maxsplit=1)[0]  # port, add, remove


def bench_growth(
    sizes: list[int], n_policies: int, n_local: int, n_changes: int
) -> list[GrowthRow]:
    """Part 4: the same node (``n_local`` pods, the same policies) in clusters of
    growing size. Most pods are on other nodes; they count because they fill the
    node's ipsets. A one-pod change should cost the same whatever the cluster's size."""
    rows = []
    for n_pods in sizes:
        world = World.build(n_pods, n_policies, n_local)
        with fresh_netns(f"g{n_pods}") as ns:
            dp = PolicyDataplane(SubprocessRunner(netns=ns), "auto")
            full_s, _ = apply(dp, world)
            members = count_kernel(ns, list(dp.backend.save))[2]
            rng = random.Random(99)
            times: list[float] = []
            kinds: dict[str, list[float]] = {}
            for step in range(n_changes):
                what = change(world, step, rng, n_policies)
                seconds, _ = apply(dp, world)
                times.append(seconds)
                kinds.setdefault(_kind(what), []).append(seconds * 1000)
        row = GrowthRow(
            n_pods,
            full_s * 1000,
            members,
            percentile(times, 50) * 1000,
            percentile(times, 99) * 1000,
            {kind: statistics.median(ms) for kind, ms in kinds.items()},
        )
        rows.append(row)
        print(
            f"  {n_pods:6d} pods: full apply {row.full_ms:6.0f} ms ({members} set members); "
            f"change p50 {row.p50_ms:4.0f} ms p99 {row.p99_ms:4.0f} ms; median by kind: "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(row.by_kind.items()))
        )
    return rows


# ---------------------------------------------------------------- throughput


def iperf(cluster: LabCluster, client: str, server_ip: str, seconds: int) -> float:
    """One iperf3 TCP run from the client pod; received bits per second."""
    argv = ["iperf3", "-c", server_ip, "-p", str(IPERF_PORT), "-t", str(seconds), "-J"]
    proc = cluster.exec(client, argv, timeout=seconds + 30)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(
            f"iperf3 gave no JSON: {proc.stdout[-500:]} {proc.stderr[-500:]}"
        ) from None
    if "error" in report:
        raise RuntimeError(f"iperf3: {report['error']}")
    return float(report["end"]["sum_received"]["bits_per_second"])


def filter_save(node_ns: str) -> list[str]:
    """The node's filter table with counters, through the backend the agent uses."""
    backend = detect_backend(SubprocessRunner(netns=node_ns), "auto")
    save = subprocess.run(
        ["ip", "netns", "exec", node_ns, *backend.save_argv("filter"), "-c"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout
    return save.splitlines()


def wait_chains(node_ns: str, chains: set[str], *, present: bool, timeout: float) -> float:
    """Poll until every chain exists and is jumped to (or none is left); seconds waited."""
    start = time.monotonic()
    while True:
        lines = filter_save(node_ns)
        have = {line[1:].split()[0] for line in lines if line.startswith(":cali-")}
        jumps = sum(1 for line in lines if "-A cali-tw-" in line and " cali-pi-" in line)
        if present and chains <= have and jumps >= len(chains):
            return time.monotonic() - start
        if not present and not chains & have:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            state = "programmed" if present else "removed"
            raise RuntimeError(f"{len(chains)} policy chains not all {state} in {timeout} s")
        time.sleep(0.5)


def policy_chain_packets(node_ns: str) -> int:
    """Packets that entered a policy chain from an endpoint chain (counter sum)."""
    total = 0
    for line in filter_save(node_ns):
        if line.startswith("[") and "-A cali-tw-" in line and " cali-pi-" in line:
            total += int(line[1:].split(":", 1)[0])
    return total


def _gbits(values: list[float]) -> str:
    return ", ".join(f"{v / 1e9:.2f}" for v in values) + " Gbit/s"


def server_policy(i: int) -> Obj:
    return {
        "metadata": {"name": f"allow-client-{i:03d}", "namespace": "bench"},
        "spec": {
            "podSelector": {"matchLabels": {"role": "server"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                    "ports": [{"port": IPERF_PORT}, {"port": 10000 + i}],
                }
            ],
        },
    }


def bench_throughput(work: Path, n_policies: int, seconds: int, runs: int) -> float:
    """Part 3: returns with/without throughput ratio."""
    start = time.monotonic()
    cluster = LabCluster.up(work / "lab", ClusterSpec(nodes=2))
    server_proc: subprocess.Popen[bytes] | None = None
    try:
        print(f"lab up in {time.monotonic() - start:.0f} s")
        cluster.create_namespace("bench")
        server = cluster.create_pod("bench", "server", "node2", {"role": "server"})
        client = cluster.create_pod("bench", "client", "node1", {"role": "client"})
        if not cluster.can_reach(client.key, server.key, timeout_s=2, attempts=5):
            raise RuntimeError("client cannot reach server before any policy")
        server_proc = subprocess.Popen(
            ["ip", "netns", "exec", server.netns, "iperf3", "-s", "-p", str(IPERF_PORT)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)
        node_ns = cluster.node("node2").netns
        without = [iperf(cluster, client.key, server.ip, seconds)]
        print(f"without policy (none exists yet): {_gbits(without)}")

        names = [f"allow-client-{i:03d}" for i in range(n_policies)]
        chains = {policy_chain_name(f"bench/{name}", "ingress") for name in names}
        applied = time.monotonic()
        for i in range(n_policies):
            cluster.apply_policy(server_policy(i))
        api_s = time.monotonic() - applied
        waited = wait_chains(node_ns, chains, present=True, timeout=PROGRAMMED_TIMEOUT_S)
        print(
            f"{n_policies} policies written in {api_s:.1f} s, all programmed on node2 "
            f"{waited:.1f} s later"
        )
        # Alternate so that drift in the machine's load lands on both sides: the
        # server's role label switches the 200 policies off (no local pod selected,
        # so none is compiled: the node is as with no policy) and on again.
        with_policy: list[float] = []
        walked = 0
        for round_ in range(runs):
            if round_:
                cluster.label_pod("bench", "server", {"role": "server"})
                wait_chains(node_ns, chains, present=True, timeout=PROGRAMMED_TIMEOUT_S)
            before = policy_chain_packets(node_ns)
            with_policy.append(iperf(cluster, client.key, server.ip, seconds))
            walked += policy_chain_packets(node_ns) - before
            if round_ < runs - 1:
                cluster.label_pod("bench", "server", {"role": "idle"})
                wait_chains(node_ns, chains, present=False, timeout=PROGRAMMED_TIMEOUT_S)
                without.append(iperf(cluster, client.key, server.ip, seconds))
        print(f"with {n_policies} policies: {_gbits(with_policy)}")
        print(f"without (policies deselected): {_gbits(without[1:])}")
        print(f"  packets that entered a policy chain during the runs with policy: {walked}")
    finally:
        if server_proc is not None:
            server_proc.terminate()
            try:
                server_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server_proc.kill()
                server_proc.wait(timeout=10)
        cluster.down()
        lab_id = cluster.lab.lab_id if cluster.lab else "?"
        left = [n for n in os.listdir("/run/netns") if n.startswith(f"tlab-{lab_id}-")]
        print(f"lab {lab_id} down; namespaces left: {len(left)}")
    mean_ratio = statistics.fmean(with_policy) / statistics.fmean(without)
    ratio = statistics.median(with_policy) / statistics.median(without)
    print(
        f"throughput median: without {statistics.median(without) / 1e9:.2f} Gbit/s, "
        f"with {statistics.median(with_policy) / 1e9:.2f} Gbit/s, ratio {ratio:.3f} "
        f"(ratio of means {mean_ratio:.3f})"
    )
    return ratio


# ---------------------------------------------------------------- the agent's memory

REMOTE_BASE = "10.250.0.0"  # remote pods' addresses: outside the lab's pool
RSS_LOCAL_PODS = 20
WRITERS = 8  # concurrent apiserver writes while the world is loaded


def _kib(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field_name} in /proc/{pid}/status")


def _agent_pid(cluster: LabCluster, node: str) -> int:
    assert cluster.lab is not None
    proc = next(p for p in cluster.lab.processes if p.name == f"tabby-node-{node}")
    assert proc.pid is not None
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    if b"tabby-node" not in cmdline:
        raise RuntimeError(f"pid {proc.pid} is not the agent: {cmdline!r}")
    return proc.pid


def _load_world(cluster: LabCluster, n_pods: int, n_policies: int) -> None:
    """Namespaces, pods bound to other nodes (with the status kubelet would write)
    and policies, written through the apiserver by a few writers at once."""
    from concurrent.futures import ThreadPoolExecutor

    from datastore import kinds

    for i in range(N_NAMESPACES):
        cluster.create_namespace(_ns_name(i), namespace_obj(i)["metadata"]["labels"])
    ds = cluster.datastore()
    rng = random.Random(7)
    objs = [pod_obj(i, rng, REMOTE_BASE) for i in range(n_pods)]

    def write_pod(i: int) -> None:
        obj = objs[i]
        meta = obj["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "nodeName": f"elsewhere-{i % 50:02d}",
                "containers": [{"image": "busybox", **c} for c in obj["spec"]["containers"]],
            },
        }
        ds.create_raw(kinds.POD, body)
        path = kinds.POD.object_path(meta["name"], meta["namespace"]) + "/status"
        ds.transport.request(
            "PATCH",
            path,
            body={"status": obj["status"]},
            content_type="application/merge-patch+json",
        )

    def write_policy(i: int) -> None:
        cluster.apply_policy(
            {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", **policy_obj(i)}
        )

    start = time.monotonic()
    with ThreadPoolExecutor(WRITERS) as pool:
        for done, _ in enumerate(pool.map(write_pod, range(n_pods)), 1):
            if done % 2000 == 0:
                print(f"  {done} pods written ({time.monotonic() - start:.0f} s)")
        list(pool.map(write_policy, range(n_policies)))
    print(f"  {n_pods} pods and {n_policies} policies written in {time.monotonic() - start:.0f} s")


def _expected_sets(cluster: LabCluster, local: list[str]) -> DesiredState:
    """What the node must hold, computed here from what the apiserver lists."""
    from datastore import kinds

    ds = cluster.datastore()
    calc = PolicyCalculator()
    for obj in ds.list_raw(kinds.NAMESPACE)[0]:
        calc.update_namespace(obj["metadata"]["name"], parse_namespace(obj))
    for obj in ds.list_raw(kinds.POD)[0]:
        pod = parse_pod(obj)
        calc.update_pod((pod.namespace, pod.name), pod)
    for obj in ds.list_raw(kinds.NETWORKPOLICY)[0]:
        policy = parse_policy(obj)
        calc.update_policy(policy.key, policy)
    for key in local:
        namespace, name = key.split("/", 1)
        calc.update_endpoint(_iface(namespace, name), (namespace, name))
    return calc.desired()


def _sets_match(node_ns: str, expected: DesiredState) -> tuple[bool, int]:
    """Does the node hold every expected set with exactly its members? (and how many
    members it holds in those sets)"""
    text = subprocess.run(
        ["ip", "netns", "exec", node_ns, "ipset", "save"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    kernel = parse_ipset_save(text, ("cali40",))
    held = sum(len(kernel[name].members) for name in expected.members if name in kernel)
    for name, members in expected.members.items():
        spec = expected.ipsets[name]
        if name not in kernel or kernel[name].members != normalize_members(spec.set_type, members):
            return False, held
    return True, held


def _wait_sets(node_ns: str, expected: DesiredState, n_members: int) -> float:
    """Seconds until the node holds every expected set with exactly its members."""
    start = time.monotonic()
    while True:
        ok, held = _sets_match(node_ns, expected)
        if ok:
            return time.monotonic() - start
        if time.monotonic() - start > PROGRAMMED_TIMEOUT_S:
            raise RuntimeError(
                f"the node's sets did not reach the expected members in "
                f"{PROGRAMMED_TIMEOUT_S:.0f} s ({held} of {n_members} held)"
            )
        time.sleep(1.0)


def bench_rss(work: Path, n_pods: int, n_policies: int) -> float:
    """Part 5: a real ``tabby-node`` watching a cluster of ``n_pods`` pods (all but a
    few on other nodes) and ``n_policies`` policies; its RSS in MiB once every set it
    must hold is in its node's kernel with exactly the expected members."""
    start = time.monotonic()
    cluster = LabCluster.up(work / "lab", ClusterSpec(nodes=1))
    try:
        pid = _agent_pid(cluster, "node1")
        idle_kib = _kib(pid, "VmRSS")
        print(
            f"lab up in {time.monotonic() - start:.0f} s; agent pid {pid}, "
            f"RSS {idle_kib / 1024:.0f} MiB"
        )
        _load_world(cluster, n_pods, n_policies)
        rng = random.Random(11)
        local = []
        for i in range(RSS_LOCAL_PODS):
            obj = pod_obj(n_pods + i, rng)
            meta = obj["metadata"]
            ports = obj["spec"]["containers"][0]["ports"]
            cluster.create_pod(meta["namespace"], meta["name"], "node1", meta["labels"], ports)
            local.append(f"{meta['namespace']}/{meta['name']}")
        expected = _expected_sets(cluster, local)
        n_members = sum(len(m) for m in expected.members.values())
        print(
            f"  {RSS_LOCAL_PODS} local pods created; the node must hold {len(expected.ipsets)} "
            f"sets with {n_members} members"
        )
        node_ns = cluster.node("node1").netns
        waited = _wait_sets(node_ns, expected, n_members)
        print(f"  every set programmed {waited:.0f} s after the last write")
        rss_kib, peak_kib = _kib(pid, "VmRSS"), _kib(pid, "VmHWM")
        print(
            f"agent RSS with {n_pods + RSS_LOCAL_PODS} pods and {n_policies} policies: "
            f"{rss_kib / 1024:.0f} MiB (peak {peak_kib / 1024:.0f} MiB; "
            f"{idle_kib / 1024:.0f} MiB in an empty cluster)"
        )
        # A restart lists every pod at once (one response, parsed whole before the
        # informer slims each pod): the peak a node sees after an upgrade or OOM kill.
        cluster.restart_agent("node1")
        pid = _agent_pid(cluster, "node1")
        waited = _wait_sets(node_ns, expected, n_members)
        print(
            f"after a restart (every set programmed again {waited:.0f} s after the socket "
            f"was back): RSS {_kib(pid, 'VmRSS') / 1024:.0f} MiB, "
            f"peak {_kib(pid, 'VmHWM') / 1024:.0f} MiB"
        )
    finally:
        cluster.down()
    return rss_kib / 1024


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000, help="pods in the cluster")
    parser.add_argument("--local-pods", type=int, help="of which on the node (default: all)")
    parser.add_argument("--policies", type=int, default=500)
    parser.add_argument(
        "--growth",
        default="1000,2500,5000,10000",
        help="cluster sizes (pods) for the growth part, comma-separated",
    )
    parser.add_argument("--growth-policies", type=int, default=2000)
    parser.add_argument("--growth-local", type=int, default=100, help="pods on the node")
    parser.add_argument("--rss-pods", type=int, default=10000, help="cluster pods (rss part)")
    parser.add_argument("--rss-policies", type=int, default=2000)
    parser.add_argument("--changes", type=int, default=30, help="incremental changes timed")
    parser.add_argument("--throughput-policies", type=int, default=200)
    parser.add_argument("--iperf-seconds", type=int, default=5)
    parser.add_argument("--iperf-runs", type=int, default=3, help="runs per condition")
    parser.add_argument(
        "--only",
        choices=("all", "apply", "growth", "rss", "throughput"),
        default="all",
        help="for development",
    )
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    p99 = bytes_ratio = throughput = cluster_p99 = rss_mib = cnp_p99 = math.nan
    if opts.only in ("all", "apply"):
        p99, bytes_ratio, cnp_p99 = bench_apply(
            opts.pods, opts.policies, opts.changes, opts.local_pods
        )
    if opts.only in ("all", "growth"):
        sizes = [int(n) for n in opts.growth.split(",") if n]
        print(
            f"growth: {opts.growth_local} pods on the node, {opts.growth_policies} policies, "
            f"{opts.changes} changes per cluster size"
        )
        rows = bench_growth(sizes, opts.growth_policies, opts.growth_local, opts.changes)
        cluster_p99 = rows[-1].p99_ms
    if opts.only in ("all", "rss"):
        with tempfile.TemporaryDirectory(prefix="tbt-bench-") as work:
            rss_mib = bench_rss(Path(work), opts.rss_pods, opts.rss_policies)
    if opts.only in ("all", "throughput"):
        with tempfile.TemporaryDirectory(prefix="tbt-bench-") as work:
            throughput = bench_throughput(
                Path(work), opts.throughput_policies, opts.iperf_seconds, opts.iperf_runs
            )
    print(f"total {time.monotonic() - started:.0f} s")
    print(
        f"policy apply_p99_ms={p99:.0f} incremental_bytes_ratio={bytes_ratio:.4f}"
        f" throughput_ratio={throughput:.3f} cluster_apply_p99_ms={cluster_p99:.0f}"
        f" agent_rss_mib={rss_mib:.0f} cnp_apply_p99_ms={cnp_p99:.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
