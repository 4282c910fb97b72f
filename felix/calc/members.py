"""Who is in each ipset, kept up to date one pod or namespace change at a time.

:func:`policy.ipset_members` answers "who is in these sets" from all pods and
namespaces; this index answers the same question after each change by looking only
at what the change can affect: a pod change re-evaluates that pod against the
active sets that can hold pods of its namespace; a namespace relabel re-evaluates
that namespace's pods against the sets that select namespaces by label; a set that
becomes active is filled from the pods it could hold. Each set records every pod's
contribution, so an address two pods claim (churn) stays until both are gone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from policy import IPSetSpec, Namespace, NetSet, Pod
from policy.model import make_namespace

PodKey = tuple[str, str]  # (namespace, name)
NO_POD: PodKey = ("", "")  # the contributor of a set whose members are fixed


class _SetState:
    """One active set: its spec, each pod's entries, and how many pods give each entry."""

    def __init__(self, spec: IPSetSpec) -> None:
        self.spec = spec
        self.by_pod: dict[PodKey, frozenset[str]] = {}
        self.counts: Counter[str] = Counter()
        self.frozen: frozenset[str] | None = None

    def set_pod(self, key: PodKey, entries: frozenset[str]) -> bool:
        """Record what ``key`` contributes now; True when the set's members changed."""
        old = self.by_pod.get(key, frozenset())
        if old == entries:
            return False
        if entries:
            self.by_pod[key] = entries
        else:
            self.by_pod.pop(key, None)
        changed = False
        for entry in old - entries:
            self.counts[entry] -= 1
            if self.counts[entry] == 0:
                del self.counts[entry]
                changed = True
        for entry in entries - old:
            changed |= entry not in self.counts
            self.counts[entry] += 1
        if changed:
            self.frozen = None
        return changed

    def members(self) -> frozenset[str]:
        if self.frozen is None:
            self.frozen = frozenset(self.counts)
        return self.frozen


class MembershipIndex:
    """Pods, namespaces and the active sets' members, updated incrementally."""

    def __init__(self) -> None:
        self._pods: dict[PodKey, Pod] = {}
        self._pods_by_namespace: dict[str, set[PodKey]] = {}
        self._ns_labels: dict[str, Mapping[str, str]] = {}
        self._sets: dict[str, _SetState] = {}
        self._sets_by_namespace: dict[str, set[str]] = {}  # sets bound to one namespace
        self._cluster_sets: set[str] = set()  # sets that may hold any namespace's pods
        self.changed: set[str] = set()  # sets whose members changed since last taken

    # -- inputs ------------------------------------------------------------------------
    def update_pod(self, key: PodKey, pod: Pod | None) -> None:
        """A pod appeared, changed or (None) went away."""
        if pod is None:
            if self._pods.pop(key, None) is None:
                return
            self._pods_by_namespace.get(key[0], set()).discard(key)
        else:
            if self._pods.get(key) == pod:
                return
            self._pods[key] = pod
            self._pods_by_namespace.setdefault(key[0], set()).add(key)
        for name in self._sets_for_namespace(key[0]):
            self._evaluate(name, key)

    def update_namespace(self, name: str, namespace: Namespace | None) -> None:
        """A namespace's labels changed (None: it is gone; its name label stays)."""
        labels = (namespace or make_namespace(name)).labels
        if self._ns_labels.get(name) == labels:
            return
        if namespace is None:
            self._ns_labels.pop(name, None)
        else:
            self._ns_labels[name] = labels
        for set_name in self._cluster_sets:
            for key in self._pods_by_namespace.get(name, ()):
                self._evaluate(set_name, key)

    def activate(self, spec: IPSetSpec) -> None:
        """Start keeping ``spec``'s members (a chain now refers to it)."""
        if spec.name in self._sets:
            return
        state = self._sets[spec.name] = _SetState(spec)
        self.changed.add(spec.name)
        if isinstance(spec, NetSet):  # fixed CIDRs: no pod contributes
            state.set_pod(NO_POD, frozenset(spec.members((), {})))
            return
        scope = spec.selection.namespace
        if scope is None:
            self._cluster_sets.add(spec.name)
            keys: Iterable[PodKey] = self._pods
        else:
            self._sets_by_namespace.setdefault(scope, set()).add(spec.name)
            keys = self._pods_by_namespace.get(scope, ())
        for key in keys:
            self._evaluate(spec.name, key)

    def deactivate(self, name: str) -> None:
        """No chain refers to the set any more."""
        state = self._sets.pop(name, None)
        if state is None:
            return
        self.changed.discard(name)
        self._cluster_sets.discard(name)
        if not isinstance(state.spec, NetSet) and state.spec.selection.namespace is not None:
            self._sets_by_namespace.get(state.spec.selection.namespace, set()).discard(name)

    # -- outputs -----------------------------------------------------------------------
    def members(self, name: str) -> frozenset[str]:
        return self._sets[name].members()

    def all_members(self) -> dict[str, frozenset[str]]:
        return {name: state.members() for name, state in self._sets.items()}

    def take_changed(self) -> set[str]:
        """The active sets whose members changed since the last call."""
        changed, self.changed = self.changed, set()
        return changed

    # -- internals ---------------------------------------------------------------------
    def _sets_for_namespace(self, namespace: str) -> list[str]:
        return [*self._sets_by_namespace.get(namespace, ()), *self._cluster_sets]

    def _labels_of(self, namespace: str) -> Mapping[str, str]:
        found = self._ns_labels.get(namespace)
        return found if found is not None else make_namespace(namespace).labels

    def _evaluate(self, set_name: str, key: PodKey) -> None:
        state = self._sets[set_name]
        pod = self._pods.get(key)
        entries: frozenset[str] = frozenset()
        if pod is not None:
            entries = frozenset(state.spec.members((pod,), {key[0]: self._labels_of(key[0])}))
        if state.set_pod(key, entries):
            self.changed.add(set_name)
