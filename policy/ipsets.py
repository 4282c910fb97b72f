"""ipset specifications (what a set means) and their members (what it holds).

Compiled chains refer to sets by name only; the name is a hash of what the set
means, never of who is in it (computed once per spec: the agent asks for it on
every pass).  That split is the incremental story: a pod that
appears, changes labels or goes away changes set members, never a chain.

Three kinds:

* :class:`SelectorSet` (``hash:ip``): IPs of the pods in a selection.
* :class:`NamedPortSet` (``hash:ip,port``): ``ip,proto:port`` for each pod
  in a selection that has a container port of that name and protocol, so a
  named port resolves per destination pod.
* :class:`NetSet` (``hash:net``): the ``except`` CIDRs of an ipBlock.

hostNetwork pods never enter a set: their IP is the node's, and a node's
traffic must not be treated as a pod's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from policy.model import IPNetwork, Namespace, Pod, PodSelection, make_namespace
from policy.naming import ipset_name


def _ipset_family(family: int) -> str:
    """ipset's ``family`` option."""
    return "inet" if family == 4 else "inet6"


@dataclass(frozen=True)
class SelectorSet:
    """Pod IPs of ``selection``."""

    family: int
    selection: PodSelection

    set_type = "hash:ip"

    @functools.cached_property
    def name(self) -> str:
        """Hash of the canonical selection."""
        return ipset_name(self.family, "s", self.selection.canonical())

    @property
    def ipset_family(self) -> str:
        """``inet`` or ``inet6``."""
        return _ipset_family(self.family)

    def members(self, pods: Iterable[Pod], ns_labels: Mapping[str, Mapping[str, str]]) -> set[str]:
        """One entry per pod IP of the family."""
        return {
            str(ip)
            for pod in pods
            if self.selection.matches(pod, _labels_of(pod.namespace, ns_labels))
            for ip in pod.ips_of(self.family)
        }


@dataclass(frozen=True)
class NamedPortSet:
    """``ip,proto:port`` of pods in ``selection`` with port ``port_name``/``protocol``."""

    family: int
    selection: PodSelection
    protocol: str
    port_name: str

    set_type = "hash:ip,port"

    @functools.cached_property
    def name(self) -> str:
        """Hash of selection, protocol and port name."""
        text = f"{self.selection.canonical()},{self.protocol},{self.port_name}"
        return ipset_name(self.family, "n", text)

    @property
    def ipset_family(self) -> str:
        """``inet`` or ``inet6``."""
        return _ipset_family(self.family)

    def members(self, pods: Iterable[Pod], ns_labels: Mapping[str, Mapping[str, str]]) -> set[str]:
        """Resolve the name on each pod; pods without the port contribute nothing."""
        out: set[str] = set()
        for pod in pods:
            number = pod.named_port(self.port_name, self.protocol)
            if number is None:
                continue
            if not self.selection.matches(pod, _labels_of(pod.namespace, ns_labels)):
                continue
            out.update(f"{ip},{self.protocol.lower()}:{number}" for ip in pod.ips_of(self.family))
        return out


@dataclass(frozen=True)
class NetSet:
    """A fixed list of CIDRs (ipBlock excepts); members do not depend on pods."""

    family: int
    nets: tuple[IPNetwork, ...]

    set_type = "hash:net"

    @functools.cached_property
    def name(self) -> str:
        """Hash of the CIDR list."""
        return ipset_name(self.family, "e", ",".join(str(n) for n in self.nets))

    @property
    def ipset_family(self) -> str:
        """``inet`` or ``inet6``."""
        return _ipset_family(self.family)

    def members(self, pods: Iterable[Pod], ns_labels: Mapping[str, Mapping[str, str]]) -> set[str]:
        """The CIDRs themselves."""
        del pods, ns_labels
        return {str(n) for n in self.nets}


IPSetSpec = SelectorSet | NamedPortSet | NetSet


def _labels_of(namespace: str, ns_labels: Mapping[str, Mapping[str, str]]) -> Mapping[str, str]:
    """A namespace's labels; one we have not seen yet still has its name label."""
    found = ns_labels.get(namespace)
    return found if found is not None else make_namespace(namespace).labels


def ipset_members(
    specs: Iterable[IPSetSpec], pods: Iterable[Pod], namespaces: Iterable[Namespace]
) -> dict[str, frozenset[str]]:
    """Set name → members, for every spec, given all pods and namespaces."""
    pod_list = list(pods)
    ns_labels = {ns.name: ns.labels for ns in namespaces}
    by_namespace: dict[str, list[Pod]] = {}
    for pod in pod_list:
        by_namespace.setdefault(pod.namespace, []).append(pod)

    def candidates(spec: IPSetSpec) -> list[Pod]:
        """Only the pods a set could contain: one namespace's, when the set is bound to one."""
        if isinstance(spec, NetSet):
            return []
        if spec.selection.namespace is not None:
            return by_namespace.get(spec.selection.namespace, [])
        return pod_list

    return {
        spec.name: frozenset(spec.members(candidates(spec), ns_labels))
        for spec in sorted(set(specs), key=lambda s: s.name)
    }
