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
  used.

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
    policies_for,
)


class PolicyCalculator:
    """Desired chains, sets and members of one node, kept per change (pure, no I/O)."""

    def __init__(self, family: int = 4, allow: str = "ACCEPT") -> None:
        self.family = family
        self.allow = allow
        self.members = MembershipIndex()
        self._pods: dict[PodKey, Pod] = {}
        self._policies_by_ns: dict[str, dict[str, NetworkPolicy]] = {}
        self._endpoints: dict[str, PodKey] = {}  # host interface -> pod
        self._ifaces_of: dict[PodKey, set[str]] = {}
        self._chains: dict[str, tuple[EndpointChains, frozenset[str]]] = {}  # + policies used
        self._compiled: dict[str, CompiledPolicy] = {}  # policies some local endpoint uses
        self._policy_users: Counter[str] = Counter()
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

    def local_pods(self) -> Mapping[str, Pod]:
        """Interface -> pod, for the endpoints whose pod is known (the others fail closed)."""
        return {i: self._pods[k] for i, k in self._endpoints.items() if k in self._pods}

    # -- internals ---------------------------------------------------------------------
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
                eps = endpoint_chains(pod, candidates, iface, self.family, self.allow)
                used = frozenset(
                    p.key
                    for direction in ("ingress", "egress")
                    for p in policies_for(pod, candidates, direction)
                )
                self._chains[iface] = (eps, used)
            for policy_key in used - old_used:
                self._use(policy_key)
            for policy_key in old_used - used:
                self._unuse(policy_key)

    def _use(self, key: str) -> None:
        self._policy_users[key] += 1
        if self._policy_users[key] == 1:
            namespace = key.split("/", 1)[0]
            policy = self._policies_by_ns[namespace][key]
            self._swap_compiled(key, compile_policy(policy, self.family))

    def _unuse(self, key: str) -> None:
        self._policy_users[key] -= 1
        if self._policy_users[key] == 0:
            del self._policy_users[key]
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
