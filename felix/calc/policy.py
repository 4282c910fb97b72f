"""A node's policy chains and ipsets, recomputed only where a change reaches.

:func:`policy.desired_state` computes a node's chains and ipsets from every pod,
namespace and policy; on a node with 1,000 pods that is done again for every ADD.
:class:`PolicyCalculator` takes the same inputs one change at a time and keeps the
answer, touching only what the change affects:

- a pod change: the sets that can hold pods of its namespace (the membership
  index), and its own endpoint chains if it is wired on this node;
- a namespace relabel: that namespace's pods in the sets selecting namespaces;
- a policy change: the endpoint chains of this node's pods in its namespace, and
  its own chains and sets if a local pod uses it;
- an endpoint wired or removed: its two chains, and the policies and sets only it
  used;
- a ClusterNetworkPolicy change: the endpoint chains of this node's pods its subject
  holds (before or after the change), and its own chains if a local pod uses it;
  while any exist, a namespace relabel also re-renders that namespace's endpoints
  (their subjects select namespaces); a Node change recompiles the used ones.

Policies and sets are reference-counted by the endpoints that use them, so a node
carries only what its pods need, as :func:`policy.desired_state` does.
:meth:`PolicyCalculator.desired` returns a :class:`policy.DesiredState` equal to the
from-scratch one (the property tests check it after random sequences of changes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from felix.calc.members import MembershipIndex, PodKey
from policy import (
    Chain,
    CompiledPolicy,
    DesiredState,
    EndpointChains,
    IPSetSpec,
    Namespace,
    NetworkPolicy,
    Pod,
    compile_policy,
    endpoint_chains,
    make_namespace,
    policies_for,
)
from policy.cluster_compiler import NodeAddresses, compile_cluster_policy
from policy.cluster_policy import ClusterNetworkPolicy
from policy.compiler import ClusterTiers

# Keys of used ClusterNetworkPolicies among the used NetworkPolicies' ("ns/name"): a
# name has no "/", so "cnp:" + name never collides with one.
CLUSTER_KEY = "cnp:"


class PolicyCalculator:
    """Desired chains, sets and members of one node, kept per change (pure, no I/O)."""

    def __init__(self, family: int = 4, allow: str = "ACCEPT") -> None:
        self.family = family
        self.allow = allow
        self.members = MembershipIndex()
        self._pods: dict[PodKey, Pod] = {}
        self._policies_by_ns: dict[str, dict[str, NetworkPolicy]] = {}
        self._cluster: dict[str, ClusterNetworkPolicy] = {}
        self._nodes: tuple[NodeAddresses, ...] = ()
        self._ns_labels: dict[str, Mapping[str, str]] = {}
        self._endpoints: dict[str, PodKey] = {}  # host interface -> pod
        self._ifaces_of: dict[PodKey, set[str]] = {}
        self._chains: dict[str, tuple[EndpointChains, frozenset[str]]] = {}  # + policies used
        self._compiled: dict[str, CompiledPolicy] = {}  # policies some local endpoint uses
        self._policy_users: Counter[str] = Counter()
        self.users_revision = 0  # bumped when the set of used policies changes
        self._set_users: Counter[str] = Counter()
        self._dirty: set[str] = set()  # interfaces whose chains must be recomputed
        # desired()'s chains and set specs, kept until an endpoint's chains or a
        # compiled policy change (most passes only move set members).
        self._layout: tuple[dict[str, Chain], dict[str, IPSetSpec]] | None = None

    # -- inputs ------------------------------------------------------------------------
    def update_pod(self, key: PodKey, pod: Pod | None) -> None:
        """A pod anywhere in the cluster appeared, changed or (None) went away."""
        if pod is None:
            self._pods.pop(key, None)
        elif self._pods.get(key) == pod:
            return
        else:
            self._pods[key] = pod
        self.members.update_pod(key, pod)
        self._dirty.update(self._ifaces_of.get(key, ()))

    def update_namespace(self, name: str, namespace: Namespace | None) -> None:
        self.members.update_namespace(name, namespace)
        labels = namespace.labels if namespace is not None else None
        if self._ns_labels.get(name) == labels:
            return
        if labels is None:
            self._ns_labels.pop(name, None)
        else:
            self._ns_labels[name] = labels
        if self._cluster:
            self._dirty.update(i for i, pod in self._endpoints.items() if pod[0] == name)

    def update_cluster_policy(self, name: str, policy: ClusterNetworkPolicy | None) -> None:
        """A ClusterNetworkPolicy appeared, changed or (None) went away."""
        old = self._cluster.get(name)
        if old == policy:
            return
        if policy is None:
            del self._cluster[name]
        else:
            self._cluster[name] = policy
        key = CLUSTER_KEY + name
        if policy is not None and key in self._compiled:
            self._swap_compiled(key, compile_cluster_policy(policy, self.family, self._nodes))
        self._dirty.update(
            iface
            for iface, pod in self._endpoints.items()
            if any(self._holds(p, pod) for p in (old, policy) if p is not None)
        )

    def update_nodes(self, nodes: tuple[NodeAddresses, ...]) -> None:
        """Every Node's labels and addresses (what ``nodes`` peers select)."""
        ordered = tuple(sorted(nodes, key=lambda n: n.name))
        if ordered == self._nodes:
            return
        self._nodes = ordered
        for key in [k for k in self._compiled if k.startswith(CLUSTER_KEY)]:
            policy = self._cluster.get(key.removeprefix(CLUSTER_KEY))
            if policy is not None:  # else deleted: its users drop it on the next pass
                self._swap_compiled(key, compile_cluster_policy(policy, self.family, ordered))

    def update_policy(self, key: str, policy: NetworkPolicy | None) -> None:
        """A NetworkPolicy (``namespace/name``) appeared, changed or went away."""
        namespace = key.split("/", 1)[0]
        in_ns = self._policies_by_ns.setdefault(namespace, {})
        if policy is None:
            if in_ns.pop(key, None) is None:
                return
        elif in_ns.get(key) == policy:
            return
        else:
            in_ns[key] = policy
        if policy is not None and key in self._compiled:
            self._swap_compiled(key, compile_policy(policy, self.family))
        self._dirty.update(i for i, pod in self._endpoints.items() if pod[0] == namespace)

    def update_endpoint(self, iface: str, pod: PodKey | None) -> None:
        """A pod was wired on this node behind ``iface`` (or, None, unwired)."""
        old = self._endpoints.get(iface)
        if old == pod:
            return
        if old is not None:
            self._ifaces_of.get(old, set()).discard(iface)
        if pod is None:
            del self._endpoints[iface]
        else:
            self._endpoints[iface] = pod
            self._ifaces_of.setdefault(pod, set()).add(iface)
        self._dirty.add(iface)

    # -- outputs -----------------------------------------------------------------------
    def desired(self) -> DesiredState:
        """Chains, set specs and members for this node, as :func:`policy.desired_state`."""
        self._recompute_dirty()
        if self._layout is None:
            self._layout = self._build_layout()
        chains, specs = self._layout
        members = {name: self.members.members(name) for name in specs}
        return DesiredState(chains, specs, members)

    def used_policies(self) -> frozenset[str]:
        """Keys of the policies a local endpoint uses (``ns/name``, ``cnp:`` + name), as of
        the last :meth:`desired`: where a policy applies (its realization status)."""
        return frozenset(self._policy_users)

    def local_pods(self) -> Mapping[str, Pod]:
        """Interface -> pod, for the endpoints whose pod is known (the others fail closed)."""
        return {i: self._pods[k] for i, k in self._endpoints.items() if k in self._pods}

    # -- internals ---------------------------------------------------------------------
    def _labels_of(self, namespace: str) -> Mapping[str, str]:
        found = self._ns_labels.get(namespace)
        return found if found is not None else make_namespace(namespace).labels

    def _holds(self, policy: ClusterNetworkPolicy, key: PodKey) -> bool:
        pod = self._pods.get(key)
        return pod is not None and policy.subject.matches(pod, self._labels_of(pod.namespace))

    def _build_layout(self) -> tuple[dict[str, Chain], dict[str, IPSetSpec]]:
        chains: dict[str, Chain] = {}
        for iface in sorted(self._chains):
            eps = self._chains[iface][0]
            chains[eps.to_workload.name] = eps.to_workload
            chains[eps.from_workload.name] = eps.from_workload
        specs: dict[str, IPSetSpec] = {}
        for key in sorted(self._compiled):
            compiled = self._compiled[key]
            chains.update((c.name, c) for c in compiled.chains)
            specs.update((s.name, s) for s in compiled.ipsets)
        return chains, dict(sorted(specs.items()))

    def _recompute_dirty(self) -> None:
        dirty, self._dirty = self._dirty, set()
        if dirty:
            self._layout = None
        for iface in dirty:
            key = self._endpoints.get(iface)
            pod = self._pods.get(key) if key is not None else None
            old_used = self._chains.pop(iface, (None, frozenset()))[1]
            used: frozenset[str] = frozenset()
            if pod is not None:
                candidates = list(self._policies_by_ns.get(pod.namespace, {}).values())
                labels = self._labels_of(pod.namespace)
                tiers = {
                    d: ClusterTiers.of(pod, self._cluster.values(), labels, d)
                    for d in ("ingress", "egress")
                }
                eps = endpoint_chains(pod, candidates, iface, self.family, self.allow, tiers)
                used = frozenset(
                    p.key
                    for direction in ("ingress", "egress")
                    for p in policies_for(pod, candidates, direction)
                ) | frozenset(
                    CLUSTER_KEY + p.name for t in tiers.values() for p in (*t.admin, *t.baseline)
                )
                self._chains[iface] = (eps, used)
            for policy_key in used - old_used:
                self._use(policy_key)
            for policy_key in old_used - used:
                self._unuse(policy_key)

    def _use(self, key: str) -> None:
        self._policy_users[key] += 1
        if self._policy_users[key] != 1:
            return
        self.users_revision += 1
        if key.startswith(CLUSTER_KEY):
            cluster = self._cluster[key.removeprefix(CLUSTER_KEY)]
            self._swap_compiled(key, compile_cluster_policy(cluster, self.family, self._nodes))
        else:
            namespace = key.split("/", 1)[0]
            policy = self._policies_by_ns[namespace][key]
            self._swap_compiled(key, compile_policy(policy, self.family))

    def _unuse(self, key: str) -> None:
        self._policy_users[key] -= 1
        if self._policy_users[key] == 0:
            del self._policy_users[key]
            self.users_revision += 1
            self._swap_compiled(key, None)

    def _swap_compiled(self, key: str, compiled: CompiledPolicy | None) -> None:
        """Replace a used policy's compiled form, moving its set references."""
        self._layout = None
        old = self._compiled.pop(key, None)
        if compiled is not None:
            self._compiled[key] = compiled
            for spec in compiled.ipsets:
                self._set_users[spec.name] += 1
                if self._set_users[spec.name] == 1:
                    self.members.activate(spec)
        for spec in old.ipsets if old is not None else ():
            self._set_users[spec.name] -= 1
            if self._set_users[spec.name] == 0:
                del self._set_users[spec.name]
                self.members.deactivate(spec.name)
