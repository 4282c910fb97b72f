"""From the informers' caches to the policy calculation, one change at a time.

Informer callbacks record only *which* Pod, Namespace or NetworkPolicy changed
(:class:`ChangedKeys`); a dataplane pass reads those objects from the caches, parses
them and feeds them to the calculation layer (:mod:`felix.calc`), which recomputes
only what they reach. A pass for one new pod therefore parses one Pod, not the
cluster's, whatever the cluster's size.

The periodic resync starts the calculation afresh from the whole caches, so a
mistake in the incremental path (or a missed event) lasts one resync period at most.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from felix.calc import PodKey, PolicyCalculator
from felix.calc.pods import PodResolver
from felix.calc.policy import CLUSTER_KEY
from policy import DesiredState, PolicyError, parse_namespace, parse_policy
from policy import Pod as PolicyPod
from policy.cluster_compiler import NodeAddresses, parse_node
from policy.cluster_policy import parse_cluster_policy
from policy.membership import AddressBook, LocalAddress
from policy.realization import NETWORKPOLICY_PREFIX, Version, cluster_policy_key, version_of

log = logging.getLogger(__name__)

# Informers whose objects the pass reads: NetworkPolicy's inputs, then (where the
# caches hold them) ClusterNetworkPolicies and the Nodes their `nodes` peers select.
POLICY_KINDS = ("pods", "namespaces", "policies", "clusterpolicies", "nodes")


class Cache(Protocol):
    """What the pass needs of an informer."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def snapshot(self) -> dict[str, dict[str, Any]]: ...


@dataclass(frozen=True)
class WiredEndpoint:
    """A pod this node's agent wired: its host interface's pod and address."""

    namespace: str
    pod: str
    address: LocalAddress


class ChangedKeys:
    """Keys of the objects that changed since the last pass, per informer (thread-safe).

    Keys only: the pass reads each object from its cache, which is never older than
    the event (informers update the cache before they call back).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, set[str]] = {kind: set() for kind in POLICY_KINDS}
        self._blocks = True

    def note(self, kind: str, key: str) -> None:
        with self._lock:
            if kind == "blocks":
                self._blocks = True
            elif kind in self._keys:
                self._keys[kind].add(key)

    def take(self) -> tuple[dict[str, set[str]], bool]:
        """(changed keys per kind, whether any IPAM block changed), then forget them."""
        with self._lock:
            keys, self._keys = self._keys, {kind: set() for kind in POLICY_KINDS}
            blocks, self._blocks = self._blocks, False
        return keys, blocks


class PolicySync:
    """The agent's policy inputs, kept in a :class:`PolicyCalculator` between passes."""

    def __init__(
        self,
        allow: str,
        changed: ChangedKeys | None = None,
        on_invalid: Callable[[], None] = lambda: None,
    ) -> None:
        self.allow = allow
        self.changed = changed or ChangedKeys()
        self._on_invalid = on_invalid
        self._fresh = True
        self._epoch = 0  # calculations started afresh so far (see programmed_revision)
        self._start_afresh()

    def _start_afresh(self) -> None:
        self.resolver = PodResolver(on_invalid=self._invalid)
        self.calc = PolicyCalculator(allow=self.allow)
        self._endpoints: dict[str, PodKey] = {}
        # The version of each policy fed to the calculation (realization keys): what a
        # pass that programs this calculation's answer has programmed.
        self._versions: dict[str, Version] = {}
        self._versions_revision = 0
        self._epoch += 1

    def programmed_revision(self) -> tuple[int, int, int]:
        """Changes whenever :meth:`programmed` may answer differently: a pass whose
        revision is unchanged need not rebuild and offer the report (the ADD path)."""
        return self._epoch, self._versions_revision, self.calc.users_revision

    def programmed(self) -> tuple[dict[str, Version], frozenset[str]]:
        """Every valid policy's version in the last computed state, and the keys of those
        that select a pod on this node (policy.realization's report)."""
        used = self.calc.used_policies()
        applied = {
            cluster_policy_key(k.removeprefix(CLUSTER_KEY))
            if k.startswith(CLUSTER_KEY)
            else NETWORKPOLICY_PREFIX + k
            for k in used
        }
        return dict(self._versions), frozenset(applied & self._versions.keys())

    def compute(
        self,
        caches: Mapping[str, Cache],
        endpoints: Mapping[str, WiredEndpoint],
        book: Callable[[], AddressBook],
        fetch_pod: Callable[[str, str], dict[str, Any] | None],
        *,
        afresh: bool = False,
    ) -> tuple[DesiredState, Mapping[str, PolicyPod]]:
        """This node's desired policy state and its local pods (interface -> pod).

        ``endpoints`` are the pods wired here; one the Pod cache does not hold yet (an
        ADD right after the Pod's creation) is read with ``fetch_pod``. ``afresh``
        (the periodic resync) rebuilds the calculation from the whole caches.
        """
        keys, blocks_changed = self.changed.take()
        if afresh or self._fresh:
            self._start_afresh()
            self._fresh = False
            keys = {
                kind: set(caches[kind].snapshot()) if kind in caches else set()
                for kind in POLICY_KINDS
            }
            blocks_changed = True
        self._feed_objects(caches, keys)
        if blocks_changed:
            self.resolver.update_book(book())
        wired = {(e.namespace, e.pod): e.address for e in endpoints.values()}
        self.resolver.update_wired(wired)
        for namespace, name in wired:
            if not self.resolver.knows((namespace, name)):
                raw = fetch_pod(namespace, name)
                if raw is not None:
                    self.resolver.update_pod((namespace, name), raw)
        for pod_key, pod in self.resolver.take():
            self.calc.update_pod(pod_key, pod)
        self._feed_endpoints(endpoints)
        return self.calc.desired(), self.calc.local_pods()

    def _feed_objects(self, caches: Mapping[str, Cache], keys: Mapping[str, set[str]]) -> None:
        for key in keys["namespaces"]:
            raw = caches["namespaces"].get(key)
            self.calc.update_namespace(key, self._parse(parse_namespace, raw))
        for key in keys["policies"]:
            raw = caches["policies"].get(key)
            parsed = self._parse(parse_policy, raw)
            self._note_version(NETWORKPOLICY_PREFIX + key, raw if parsed else None)
            self.calc.update_policy(key, parsed)
        if keys["clusterpolicies"] and "clusterpolicies" in caches:
            for key in keys["clusterpolicies"]:
                raw = caches["clusterpolicies"].get(key)
                parsed = self._parse(parse_cluster_policy, raw)
                self._note_version(cluster_policy_key(key), raw if parsed else None)
                self.calc.update_cluster_policy(key, parsed)
        if keys["nodes"] and "nodes" in caches:
            self.calc.update_nodes(self._nodes(caches["nodes"]))
        for key in keys["pods"]:
            namespace, _, name = key.partition("/")
            self.resolver.update_pod((namespace, name), caches["pods"].get(key))

    def _note_version(self, key: str, raw: dict[str, Any] | None) -> None:
        """A valid policy's version (None: gone or invalid, so not programmed)."""
        version = None if raw is None else version_of(raw)
        if self._versions.get(key) == version:
            return
        if version is None:
            del self._versions[key]
        else:
            self._versions[key] = version
        self._versions_revision += 1

    def _nodes(self, cache: Cache) -> tuple[NodeAddresses, ...]:
        parsed = (self._parse(parse_node, raw) for raw in cache.snapshot().values())
        return tuple(n for n in parsed if n is not None)

    def _feed_endpoints(self, endpoints: Mapping[str, WiredEndpoint]) -> None:
        now = {iface: (e.namespace, e.pod) for iface, e in endpoints.items()}
        for iface in self._endpoints.keys() | now.keys():
            self.calc.update_endpoint(iface, now.get(iface))
        self._endpoints = now

    def _parse(self, parse: Callable[[Any], Any], raw: dict[str, Any] | None) -> Any:
        """The parsed object, or None for a missing or invalid one (reported)."""
        if raw is None:
            return None
        try:
            return parse(raw)
        except PolicyError as exc:
            self._invalid(exc)
            return None

    def _invalid(self, exc: PolicyError) -> None:
        self._on_invalid()
        log.warning("skipping invalid object: %s", exc)
