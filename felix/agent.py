"""tabby-node: the per-node agent.

It wires the parts together and owns nothing else:

    informers (datastore) --changes--> ReconcileLoop --pass--> dataplane managers
        (felix.managers, in this order: endpoints, policy, tunnels, BGP; each
        on_update / apply / resync, the full resync on the loop's timer)
    CNI server (unix socket) --ADD/DEL--> IPAM + pod wiring --> endpoint hook
    HealthServer: /healthz, /readyz (datastore synced, dataplane programmed), /metrics

Start-up order matters for safety: caches sync first, the dataplane is programmed,
and only then does the CNI server report ready, so no pod is wired before the node
knows its pools and policy.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bgp.annotations import IPV4_ADDRESS
from bgp.config import BGP_SECRET, BGP_SECRET_NAMESPACE
from bgp.controller import BGPController
from bgp.speaker import SpeakerOptions, default_status_path
from datastore import kinds
from datastore.client import Datastore
from datastore.errors import DatastoreError, NotConfigured, NotFound
from datastore.incluster import choose_kubeconfig
from datastore.informer import Handlers, Informer, object_key, without_managed_fields
from datastore.models import IPPool
from felix import logs
from felix.bgp_guard import DEFAULT_POD_TO_NODE_BGP, NodeAddresses, parse_pod_to_node_bgp
from felix.cni_server import (
    ANNOTATION_CONTAINER_ID,
    ANNOTATION_POD_IP,
    AddJournal,
    CNIHandlers,
    CNIRequest,
    CNIServer,
    Endpoint,
    Holding,
    PodKey,
    recover_after_restart,
)
from felix.dataplane.runner import SubprocessRunner
from felix.events import post_pod_event
from felix.health import HealthServer, Readiness
from felix.loop import ReconcileLoop, backoff_s
from felix.managers import (
    BGPManager,
    DataplaneManager,
    EndpointWiring,
    NatOutgoingDataplane,
    NatOutgoingManager,
    PolicyManager,
    PolicySources,
    TunnelManager,
    drive,
)
from felix.managers.tunnels import TunnelNode
from felix.nat_outgoing import PoolNat
from felix.pod_members import IPAMOwners
from felix.policy_dataplane import (
    DEFAULT_ENDPOINT_TO_HOST_ACTION,
    DEFAULT_FILTER_ALLOW_ACTION,
    PolicyDataplane,
    parse_endpoint_to_host_action,
    parse_filter_allow_action,
)
from felix.policy_sync import ChangedKeys, PolicySync, WiredEndpoint
from felix.realization import RealizationReporter
from felix.reasons import ENDPOINT_ADDED, ENDPOINT_REMOVED, PERIODIC_RESYNC, STATUS_STALE
from felix.shared_pass import SharedPass
from ipam.allocator import AGENT_PRECLAIM_BELOW, IPAMAllocator
from ipam.batch import AssignBatcher
from ipam.selector import SelectorError, parse_selector
from kernel import iproute_factory
from policy.membership import local_address
from policy.pod_fields import slim_pod

log = logging.getLogger(__name__)

SYNC_TIMEOUT_S = 60.0
# Kinds a cluster may lack (a CRD not installed): none of them is read as none, and
# they are looked for again (datastore.informer); every other kind must be served.
OPTIONAL_KINDS = (kinds.CLUSTERNETWORKPOLICY,)


@dataclass
class AgentConfig:
    """Everything the agent needs to know about where it runs."""

    node_name: str
    kubeconfig: str | None  # None: the pod's in-cluster ServiceAccount
    run_dir: Path = Path("/run/tabby")
    health_host: str = "127.0.0.1"
    health_port: int = 9099
    mtu: int = 1500
    resync_interval_s: float = 60.0
    log_level: str = "info"
    node_ip: str | None = None  # "172.31.0.11/24": BGP address and subnet of this node
    bgp: bool = True
    policy: bool = True
    iptables_backend: str = "auto"  # auto | nft | legacy | legacy-iptc
    endpoint_to_host: str = DEFAULT_ENDPOINT_TO_HOST_ACTION  # pods to their own node
    filter_allow: str = DEFAULT_FILTER_ALLOW_ACTION  # ACCEPT or RETURN what policy allows
    pod_to_node_bgp: str = DEFAULT_POD_TO_NODE_BGP  # DROP: pods never reach a node's 179

    @property
    def bgp_status_file(self) -> Path:
        return default_status_path(self.run_dir)

    @property
    def cni_socket(self) -> Path:
        return self.run_dir / "cni.sock"


class Metrics:
    """The agent's Prometheus metrics, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.cni_latency = Histogram(
            "tabby_cni_request_seconds",
            "CNI request handling time in the agent",
            ["command", "result"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.cni_add_phase = Histogram(
            "tabby_cni_add_phase_seconds",
            "Time of each step of a successful CNI ADD in the agent: assign, wire, "
            "program (policy ready), annotate (what was left of the Pod annotation, "
            "written beside the program step)",
            ["phase"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.dataplane_apply = Histogram(
            "tabby_dataplane_apply_seconds",
            "Time of one dataplane sync pass",
            registry=self.registry,
        )
        self.bgp_peers_up = Gauge(
            "tabby_bgp_peers_up", "Established BGP sessions", registry=self.registry
        )
        self.ipam_in_use = Gauge(
            "tabby_ipam_addresses_in_use",
            "Pod addresses assigned on this node",
            registry=self.registry,
        )
        self.endpoints = Gauge(
            "tabby_workload_endpoints", "Pods wired on this node", registry=self.registry
        )
        self.invalid_objects = Counter(
            "tabby_invalid_objects_total", "API objects skipped as invalid", registry=self.registry
        )
        self.sync_failures = Counter(
            "tabby_sync_failures_total", "Failed dataplane passes", registry=self.registry
        )
        self.policy_status_writes = Counter(
            "tabby_policy_status_writes_total",
            "Writes of this node's NodePolicyStatus (coalesced: one per burst of passes)",
            ["result"],
            registry=self.registry,
        )


class IPAMAddresses:
    """Adapts the IPAM allocator to what the CNI server needs (idempotent per handle).

    The handles this node holds are loaded once at start; a repeated ADD (or one
    after an agent restart) finds its address again without a datastore read for
    every new pod.
    """

    def __init__(
        self, allocator: IPAMAllocator, pools: Informer, node_labels: Mapping[str, str]
    ) -> None:
        self.allocator = allocator
        self.pools = pools
        self.node_labels = node_labels
        self._lock = threading.Lock()
        self._known = allocator.node_handles()
        self._batcher = AssignBatcher(allocator.auto_assign_each)

    def assign(self, handle_id: str, attrs: Mapping[str, str]) -> IPv4Address:
        with self._lock:
            known = handle_id in self._known
        if known:
            existing = self.allocator.addresses_of(handle_id)
            if existing:
                return existing[0]
        address = self._batcher.assign(handle_id, attrs)  # a burst shares block writes
        with self._lock:
            self._known.add(handle_id)
        return address

    def allocations(self) -> dict[str, Holding]:
        """This node's handles with their first address and its attributes (one list)."""
        held = {h: Holding(*found[0]) for h, found in self.allocator.node_allocations().items()}
        with self._lock:
            self._known = set(held)
        return held

    def release(self, handle_id: str) -> None:
        self.allocator.release_by_handle(handle_id)
        with self._lock:
            self._known.discard(handle_id)

    def handles(self) -> set[str]:
        """This node's handles only: CNI GC must never touch another node's pods."""
        handles = self.allocator.node_handles()
        with self._lock:
            self._known = set(handles)
        return handles

    def ready(self) -> bool:
        """A pool that is enabled and selects this node exists."""
        for raw in self.pools.snapshot().values():
            pool = IPPool.from_wire(raw)
            if pool.spec.disabled:
                continue
            try:
                if parse_selector(pool.spec.node_selector).matches(self.node_labels):
                    return True
            except SelectorError:
                continue
        return False


class TimedHandlers(CNIHandlers):
    """CNIHandlers that record each request's latency and report failed ADDs on the Pod."""

    def __init__(
        self,
        allocator: IPAMAddresses,
        *,
        metrics: Metrics,
        report_failure: Callable[[str, str, str], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(allocator, **kwargs)
        self.metrics = metrics
        self.report_failure = report_failure

    def handle(self, request: CNIRequest) -> dict[str, Any] | None:
        began = time.perf_counter()
        outcome = "error"
        try:
            result = super().handle(request)
            outcome = "ok"
            return result
        except Exception as exc:
            namespace, pod, _ = request.pod
            if request.command == "ADD" and namespace and pod:
                self.report_failure(namespace, pod, getattr(exc, "msg", str(exc)))
            raise
        finally:
            self.metrics.cni_latency.labels(request.command, outcome).observe(
                time.perf_counter() - began
            )
            self.metrics.endpoints.set(len(self.endpoints.all()))


class Agent:
    """One node's agent; `run()` blocks until SIGTERM/SIGINT."""

    def __init__(self, config: AgentConfig, datastore: Datastore) -> None:
        self.config = config
        self.datastore = datastore
        self.metrics = Metrics()
        self.readiness = Readiness("datastore", "dataplane")
        self.stopping = threading.Event()
        self._sync_lock = threading.Lock()  # the policy pass (its calculation's state)
        self._routing_lock = threading.Lock()  # tunnels, node address, BGP
        self._status_lock = threading.Lock()
        self.loop = ReconcileLoop(self._sync, config.resync_interval_s, name="dataplane")
        self._add_passes = SharedPass(lambda: self._sync({ENDPOINT_ADDED}))
        self.informers: dict[str, Informer] = {}
        self.node_labels: dict[str, str] = {}
        self.cni: CNIServer | None = None
        self.handlers: TimedHandlers | None = None
        self.health: HealthServer | None = None
        self.bgp: BGPController | None = None
        self.policy: PolicyDataplane | None = None
        self.policy_sync: PolicySync | None = None
        self.realization: RealizationReporter | None = None  # the NodePolicyStatus writer
        # the dataplane managers, driven in this order by every pass (felix.managers)
        self.endpoint_wiring: EndpointWiring | None = None
        self.policy_manager: PolicyManager | None = None
        self.nat_outgoing: NatOutgoingManager | None = None  # when policy is off
        self.tunnels: TunnelManager | None = None
        self.bgp_manager: BGPManager | None = None
        # informers note what changed from their first event on; the pass reads it
        self.policy_sync_changes = ChangedKeys()
        self._node_missing = False  # our Node object was absent on the last pass
        self.allocator: IPAMAllocator | None = None
        self._node_addresses = NodeAddresses()  # the BGP guard's set, parsed on change
        self.ipam_owners = IPAMOwners(on_invalid=self.metrics.invalid_objects.inc)
        self._retries: dict[str, tuple[int, str]] = {}  # pass -> (failures in a row, error)

    # -- start-up -----------------------------------------------------------------------
    def start(self) -> None:
        prepare_run_dir(self.config.run_dir)
        self.health = HealthServer(
            self.readiness, self.metrics.registry, self.config.health_host, self.config.health_port
        ).start()
        self._start_informers()
        self._wait_synced()
        self._publish_node_address()
        self.node_labels = self._read_node_labels()
        if self.config.policy:
            self.policy = PolicyDataplane(
                SubprocessRunner(),
                self.config.iptables_backend,
                self.config.endpoint_to_host,
                self.config.filter_allow,
                self.config.pod_to_node_bgp,
            )
            self.policy_sync = PolicySync(
                self.policy.allow,
                self.policy_sync_changes,
                on_invalid=self.metrics.invalid_objects.inc,
            )
        if self.config.bgp:
            self.bgp = BGPController(
                self.config.node_name,
                SpeakerOptions(
                    workdir=self.config.run_dir / "bgp",
                    status_file=self.config.bgp_status_file,
                    on_peers=self._bgp_peers_changed,  # /readyz follows BGP as it happens
                ),
                iproute_factory(None),
            )
        allocator = IPAMAllocator(
            self.datastore,
            self.config.node_name,
            node_labels=self.node_labels,
            on_block_claimed=self._block_claimed,
            preclaim_below=AGENT_PRECLAIM_BELOW,
        )
        self.allocator = allocator
        addresses = IPAMAddresses(allocator, self.informers["pools"], self.node_labels)
        self.handlers = TimedHandlers(
            addresses,
            metrics=self.metrics,
            report_failure=self._report_add_failure,
            annotate=self._annotate_pod,
            on_endpoint_added=self._endpoint_added,
            on_endpoint_removed=self._endpoint_removed,
            observe_add_phases=self._observe_add_phases,
            default_mtu=self.config.mtu,
            journal=AddJournal(self.config.run_dir / "cni-inflight"),
        )
        self._make_managers(allocator)
        # Before any pass or CNI call: undo what a killed agent left half done, then
        # re-adopt the pods that are fully wired (into the one endpoint table) so their
        # policy is programmed again.
        recover_after_restart(self.handlers, owner_alive=self._pod_alive)
        self.loop.start()
        self._sync({"startup"})
        self.readiness.set("dataplane", True)
        self.handlers.set_synced(True)
        self.cni = CNIServer(str(self.config.cni_socket), self.handlers)
        self.cni.start()
        log.info("agent ready", extra={"cni_socket": str(self.config.cni_socket)})

    def _make_managers(self, allocator: IPAMAllocator) -> None:
        """The dataplane managers, each over its own part (see :mod:`felix.managers`)."""
        assert self.handlers is not None
        self.endpoint_wiring = EndpointWiring(self.handlers.repair)
        if self.policy is not None and self.policy_sync is not None:
            sources = PolicySources(
                caches=self.informers,
                local_endpoints=self._local_endpoints,
                address_book=lambda: self.ipam_owners.book(self._objects("blocks")),
                fetch_pod=self._fetch_pod,
                pools=self._pool_nat,
                hosts=lambda: self._node_addresses(self._objects("nodes")),
            )
            self.realization = RealizationReporter(
                self.datastore,
                self.config.node_name,
                on_write=lambda ok: self.metrics.policy_status_writes.labels(
                    "ok" if ok else "error"
                ).inc(),
            )
            self.realization.start()
            self.policy_manager = PolicyManager(
                self.policy_sync, self.policy, sources, self.realization.offer
            )
        else:  # another engine enforces policy; natOutgoing is still Tabby's
            nat = NatOutgoingDataplane(SubprocessRunner(), self.config.iptables_backend)
            self.nat_outgoing = NatOutgoingManager(nat, self._pool_nat)
        node = TunnelNode(self.config.node_name, self.config.node_ip or "", self.config.mtu)
        self.tunnels = TunnelManager(
            node, self._objects, allocator.tunnel_address, self._annotate_node, iproute_factory()
        )
        if self.bgp is not None:
            self.bgp_manager = BGPManager(
                self.bgp, self._objects, self.metrics.invalid_objects.inc, self._bgp_peers_changed
            )

    def _start_informers(self) -> None:
        specs: dict[str, tuple[kinds.ResourceKind, str | None]] = {
            # the one Secret BGP passwords come from (RBAC: that name only)
            "bgpsecrets": (kinds.SECRET, f"metadata.name={BGP_SECRET}"),
            "pools": (kinds.IPPOOL, None),
            "nodes": (kinds.NODE, None),
            "pods": (kinds.POD, None),  # every pod of the cluster: slimmed (slim_pod)
            "namespaces": (kinds.NAMESPACE, None),
            "policies": (kinds.NETWORKPOLICY, None),
            "clusterpolicies": (kinds.CLUSTERNETWORKPOLICY, None),
            "bgpconfigs": (kinds.BGPCONFIGURATION, None),
            "bgppeers": (kinds.BGPPEER, None),
            "affinities": (kinds.BLOCKAFFINITY, None),
            "blocks": (kinds.IPAMBLOCK, None),
        }
        for name, (kind, field_selector) in specs.items():
            informer = Informer(
                self.datastore,
                kind,
                self._requester(name),
                namespace=BGP_SECRET_NAMESPACE if kind is kinds.SECRET else None,
                field_selector=field_selector,
                transform=slim_pod if kind is kinds.POD else without_managed_fields,
                optional=kind in OPTIONAL_KINDS,
            )
            self.informers[name] = informer.start()

    def _requester(self, reason: str) -> Handlers:
        """Informer callbacks that only ask the loop for a pass (work happens there)."""

        def changed(*objects: dict[str, Any]) -> None:
            if objects:
                self.policy_sync_changes.note(reason, object_key(objects[-1]))
            self.loop.request(reason)

        return Handlers(on_add=changed, on_update=changed, on_delete=changed)

    def _objects(self, informer: str) -> list[dict[str, Any]]:
        return list(self.informers[informer].snapshot().values())

    def _wait_synced(self) -> None:
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        for name, informer in self.informers.items():
            if not informer.wait_synced(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"datastore cache {name} did not sync in {SYNC_TIMEOUT_S:.0f}s")
        self.readiness.set("datastore", True)

    def _read_node_labels(self) -> dict[str, str]:
        for raw in self.informers["nodes"].snapshot().values():
            if raw["metadata"]["name"] == self.config.node_name:
                return dict(raw["metadata"].get("labels") or {})
        log.warning("Node %s not found in the datastore; using no labels", self.config.node_name)
        return {}

    # -- hooks from the CNI server ------------------------------------------------------
    def _annotate_pod(self, pod: PodKey, annotations: Mapping[str, str]) -> None:
        if not annotations.get(ANNOTATION_POD_IP) and not self._owns(pod):
            return  # a late DEL of an older sandbox must not clear the new one's address
        patch = {"metadata": {"annotations": {k: (v or None) for k, v in annotations.items()}}}
        try:
            self.datastore.patch_raw(kinds.POD, pod.name, patch, pod.namespace)
        except NotFound:
            log.info("pod %s/%s is gone; not annotated", pod.namespace, pod.name)

    def _owns(self, pod: PodKey) -> bool:
        try:
            raw = self.datastore.get_raw(kinds.POD, pod.name, pod.namespace)
        except DatastoreError:
            return False
        current = (raw["metadata"].get("annotations") or {}).get(ANNOTATION_CONTAINER_ID)
        return current in (None, pod.container_id)

    def _report_add_failure(self, namespace: str, pod: str, message: str) -> None:
        post_pod_event(
            self.datastore,
            namespace,
            pod,
            "FailedCreatePodNetwork",
            f"tabby could not set up the pod network: {message}",
            self.config.node_name,
        )

    def _endpoint_added(self, endpoint: Endpoint) -> None:
        """ADD waits here: the endpoint is programmed before the pod gets its answer.

        Concurrent ADDs share passes (:mod:`felix.shared_pass`): each returns once a
        pass that began after its endpoint was registered has succeeded.
        """
        del endpoint  # registered already; the pass reads every registered endpoint
        self._add_passes.run_covering()

    def _observe_add_phases(self, phases: Mapping[str, float]) -> None:
        for phase, seconds in phases.items():
            self.metrics.cni_add_phase.labels(phase).observe(seconds)

    def _block_claimed(self, block: IPv4Network) -> None:
        """Announce a block the moment we claim it, not after its watch event arrives."""
        bgp = self.bgp
        if bgp is not None:
            self._best_effort(lambda: bgp.block_claimed(block), "bgp")

    def _endpoint_removed(self, endpoint: Endpoint) -> None:
        self.loop.request(f"{ENDPOINT_REMOVED}:{endpoint.host_ifname}")

    # -- the dataplane pass -------------------------------------------------------------
    def _sync(self, reasons: set[str]) -> None:
        """One pass: every manager is told what changed, then driven in order (the full
        resync on the loop's timer, else only the changes)."""
        if reasons == {STATUS_STALE}:
            self._write_status()
            return
        resync = PERIODIC_RESYNC in reasons
        for manager in self._managers():
            manager.on_update(reasons)
        if resync and self.endpoint_wiring is not None:
            # Outside the pass's lock: a repair takes its pod's CNI lock, and an ADD
            # holding that lock waits for a pass in on_endpoint_added.
            self._best_effort(self.endpoint_wiring.resync, "endpoints")
        with self.metrics.dataplane_apply.time():
            log.debug("dataplane pass", extra={"reasons": sorted(reasons)})
            # Policy failures propagate: an ADD must not succeed unprotected. Routing
            # failures are retried by the loop and never fail a pod's ADD.
            if self.policy_manager is not None:
                with self._sync_lock:
                    drive(self.policy_manager, resync)
            if reasons == {ENDPOINT_ADDED}:  # an ADD waits for its policy only
                self.loop.request(STATUS_STALE)
                return
            # Under their own lock: an ADD's policy pass need not wait for BGP.
            with self._routing_lock:
                self._sync_routing(resync)
            self._write_status()

    def _managers(self) -> list[DataplaneManager]:
        managers = (
            self.endpoint_wiring,
            self.policy_manager,
            self.nat_outgoing,
            self.tunnels,
            self.bgp_manager,
        )
        return [m for m in managers if m is not None]

    def _sync_routing(self, resync: bool) -> None:
        """natOutgoing when policy is off, tunnels, this node's published address and
        BGP (never fails a pass)."""
        nat = self.nat_outgoing
        if nat is not None:
            self._best_effort(lambda: drive(nat, resync), "nat-outgoing")
        tunnels = self.tunnels
        if tunnels is not None and self.config.node_ip:
            self._best_effort(lambda: drive(tunnels, resync), "tunnels")
        # Every pass, from the cache (a patch only on a difference): a Node deleted and
        # registered again by its kubelet comes back without our annotations.
        self._best_effort(self._publish_node_address, "node-address")
        bgp = self.bgp_manager
        if bgp is not None:
            self._best_effort(lambda: drive(bgp, resync), "bgp")

    def _best_effort(self, step: Callable[[], None], name: str) -> None:
        condition = f"{name}-programmed"
        try:
            step()
        except Exception as exc:
            # Backed off (not rerun at once): input that keeps failing must not spin a
            # core and flood the log; the traceback is logged once per distinct error.
            failures, last = self._retries.get(name, (0, ""))
            failures, text = failures + 1, f"{type(exc).__name__}: {exc}"
            self._retries[name] = (failures, text)
            delay = backoff_s(failures)
            self.metrics.sync_failures.inc()
            if text != last:
                log.exception("%s pass failed; retrying in %.1fs", name, delay)
            else:
                log.warning(
                    "%s pass failed again (%d in a row); retrying in %.0fs: %s",
                    name,
                    failures,
                    delay,
                    text[:300],
                )
            self.readiness.set(condition, False, f"{name} pass failed; see the agent log")
            self.loop.request_after(f"retry-{name}", delay)
        else:
            self._retries.pop(name, None)
            self.readiness.set(condition, True)

    def _annotate_node(self, annotations: dict[str, str]) -> None:
        """Patch our Node only when the annotations differ from what the cache holds."""
        for raw in self._objects("nodes"):
            if raw["metadata"]["name"] == self.config.node_name:
                current = raw["metadata"].get("annotations") or {}
                if all(current.get(k) == v for k, v in annotations.items()):
                    return
        with contextlib.suppress(NotFound):
            self.datastore.patch_raw(
                kinds.NODE, self.config.node_name, {"metadata": {"annotations": annotations}}
            )

    def _pool_nat(self) -> list[PoolNat]:
        """natOutgoing of each pool, for the policy manager's nat table."""
        return [
            PoolNat(pool.spec.cidr, pool.spec.nat_outgoing)
            for pool in (IPPool.from_wire(o) for o in self._objects("pools"))
        ]

    def _local_endpoints(self) -> dict[str, WiredEndpoint]:
        """host interface -> the pod wired behind it and its address, for every pod here
        (wired by an ADD, which names the Pod's UID, or re-adopted after a restart)."""
        local: dict[str, WiredEndpoint] = {}
        if self.handlers is not None:
            for ep in self.handlers.endpoints.all():
                if ep.namespace and ep.pod:
                    address = local_address(str(ep.address), ep.pod_uid)
                    local[ep.host_ifname] = WiredEndpoint(ep.namespace, ep.pod, address)
        return local

    def _fetch_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A pod the cache has not seen yet (ADD right after create): read it directly.
        Its address is the one this agent wired, never what the object claims."""
        try:
            return self.datastore.get_raw(kinds.POD, name, namespace)
        except DatastoreError:
            return None

    def _pod_alive(self, endpoint: Endpoint) -> bool | None:
        """Recovery's owner check, from the synced Pod cache: False when the Pod is gone
        (or re-created with another UID), None when the endpoint names no Pod."""
        if not (endpoint.namespace and endpoint.pod):
            return None
        for raw in self._objects("pods"):
            meta = raw.get("metadata") or {}
            if meta.get("namespace") == endpoint.namespace and meta.get("name") == endpoint.pod:
                return endpoint.pod_uid in (None, meta.get("uid"))
        return False

    def _bgp_peers_changed(self, peers: list[dict[str, Any]]) -> None:
        """BGP readiness and the sessions gauge: from each pass, and from the speaker the
        moment a session changes state (so /readyz does not wait for a resync)."""
        up = sum(1 for p in peers if p.get("state") == "up")
        self.metrics.bgp_peers_up.set(up)
        self.readiness.set("bgp", up == len(peers), f"{up}/{len(peers)} BGP sessions established")

    def _publish_node_address(self) -> None:
        """Put this node's BGP address on its Node object, for its peers to find."""
        if not self.config.node_ip:
            return
        if not any(n["metadata"]["name"] == self.config.node_name for n in self._objects("nodes")):
            if not self._node_missing:  # once per absence, not on every pass
                log.warning(
                    "Node %s does not exist; its BGP address is not published",
                    self.config.node_name,
                )
            self._node_missing = True
            return
        if self._node_missing:
            log.info("Node %s exists again; publishing its BGP address", self.config.node_name)
        self._node_missing = False
        self._annotate_node({IPV4_ADDRESS: self.config.node_ip})

    def status(self) -> dict[str, Any]:
        """What `tabbyctl endpoints` and `tabbyctl node status` show for this node."""
        endpoints = self.handlers.endpoints.all() if self.handlers else []
        return {
            "node": self.config.node_name,
            "pid": os.getpid(),
            "updated": time.time(),
            "ready": self.readiness.ready(),
            "conditions": self.readiness.report(),
            "endpoints": [
                {
                    "namespace": e.namespace,
                    "pod": e.pod,
                    "interface": e.host_ifname,
                    "ip": str(e.address),
                    "container_id": e.container_id,
                }
                for e in sorted(endpoints, key=lambda e: (e.namespace or "", e.pod or ""))
            ],
        }

    def _write_status(self) -> None:
        path = self.config.run_dir / "status.json"
        tmp = path.with_suffix(".tmp")
        with self._status_lock:  # passes of ADDs and of the loop may end together
            # Compact: with indent, json uses its pure-Python encoder (several times
            # slower, and the loop writes this after the passes of a burst of ADDs).
            tmp.write_text(json.dumps(self.status(), separators=(",", ":")))
            tmp.replace(path)

    # -- shutdown -----------------------------------------------------------------------
    def stop(self) -> None:
        """Graceful: stop answering ready, stop taking CNI calls, then stop the rest."""
        self.readiness.shutting_down = True
        if self.cni is not None:
            self.cni.stop()
        if self.handlers is not None:
            self.handlers.close(timeout=2.0)  # markers left behind are finished at restart
        if self.allocator is not None:
            self.allocator.close()  # a background block claim in flight finishes first
        for informer in self.informers.values():
            informer.stop(timeout=0)  # signal all first; watches blocked in a read are daemons
        self.loop.stop()
        if self.realization is not None:
            self.realization.stop(timeout=1.0)
        if self.bgp is not None:
            self.bgp.stop()  # leaves learned routes in the kernel: graceful restart
        if self.health is not None:
            self.health.stop()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        self.start()
        settle_heap()
        self.stopping.wait()
        log.info("stopping")
        self.stop()
        return 0


def prepare_run_dir(run_dir: Path) -> None:
    """The agent's run directory, root-only (0700) even where it already existed.

    The DaemonSet's hostPath (DirectoryOrCreate) makes /run/tabby 0755; inside are the
    CNI socket, the ADD journal with every pod's sandbox and address, BGP's work dir
    and the status files: nothing a non-root process on the node should read.
    """
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(run_dir, 0o700)


def settle_heap() -> None:
    """Collect, then freeze what start-up built (modules, clients, informer caches).

    Python's full collection walks every tracked object: in the IPAM bench's process
    (kubernetes client loaded) one took 30-44 ms, landing on whichever allocation
    triggered it, about once per 1,000. Frozen objects are never walked again (nor
    freed: start-up state lives as long as the agent anyway).
    """
    gc.collect()
    gc.freeze()


def _endpoint_to_host_action(value: str) -> str:
    """argparse type: a bad value is a usage error naming the choices, not a traceback."""
    try:
        return parse_endpoint_to_host_action(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _filter_allow_action(value: str) -> str:
    """argparse type: a bad value is a usage error naming the choices."""
    try:
        return parse_filter_allow_action(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _pod_to_node_bgp(value: str) -> str:
    """argparse type: a bad value is a usage error naming the choices."""
    try:
        return parse_pod_to_node_bgp(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None = None) -> AgentConfig:
    parser = argparse.ArgumentParser(prog="tabby-node", description=__doc__.split("\n")[0])
    parser.add_argument("--node-name", default=os.environ.get("NODENAME"), required=False)
    parser.add_argument(
        "--kubeconfig",
        help="default: $KUBECONFIG, else the pod's ServiceAccount (in-cluster)",
    )
    parser.add_argument("--run-dir", default=os.environ.get("TABBY_RUN_DIR", "/run/tabby"))
    parser.add_argument("--health-port", type=int, default=9099)
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--resync-interval", type=float, default=60.0)
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--node-ip",
        default=os.environ.get("TABBY_NODE_IP"),
        help="This node's address/prefix for BGP, e.g. 172.31.0.11/24",
    )
    parser.add_argument("--no-bgp", action="store_true", help="Do not run the BGP speaker")
    parser.add_argument(
        "--no-policy",
        action="store_true",
        default=os.environ.get("TABBY_POLICY", "on") == "off",
        help="Do not program NetworkPolicy: another engine enforces it "
        "($TABBY_POLICY=off; default on)",
    )
    parser.add_argument(
        "--iptables-backend",
        default=os.environ.get("TABBY_IPTABLES_BACKEND", "auto"),
        choices=["auto", "nft", "legacy", "legacy-iptc"],
    )
    parser.add_argument(
        "--endpoint-to-host",
        default=os.environ.get(
            "TABBY_DEFAULT_ENDPOINT_TO_HOST_ACTION", DEFAULT_ENDPOINT_TO_HOST_ACTION
        ),
        type=_endpoint_to_host_action,
        help="What traffic from a pod to its own node gets after its egress policy: "
        "Drop (default), Accept, or Return (the host's own INPUT rules decide); "
        "$TABBY_DEFAULT_ENDPOINT_TO_HOST_ACTION",
    )
    parser.add_argument(
        "--filter-allow-action",
        default=os.environ.get("TABBY_IPTABLES_FILTER_ALLOW_ACTION", DEFAULT_FILTER_ALLOW_ACTION),
        type=_filter_allow_action,
        help="What Tabby's filter rules do with traffic policy allows: Accept (default; "
        "at the bottom of FORWARD, after kube-proxy's rules) or Return (the kernel "
        "chains' later rules and policy decide); $TABBY_IPTABLES_FILTER_ALLOW_ACTION",
    )
    parser.add_argument(
        "--pod-to-node-bgp",
        default=os.environ.get("TABBY_POD_TO_NODE_BGP", DEFAULT_POD_TO_NODE_BGP),
        type=_pod_to_node_bgp,
        help="Drop (default): pods never reach port 179 of any node, dropped at their "
        "own node; Allow: policy decides, as for any port; $TABBY_POD_TO_NODE_BGP",
    )
    opts = parser.parse_args(argv)
    if os.environ.get("TABBY_POLICY", "on") not in ("on", "off"):
        parser.error(f"$TABBY_POLICY must be on or off, got {os.environ['TABBY_POLICY']!r}")
    if not opts.node_name:
        parser.error("--node-name (or $NODENAME) is required")
    try:
        kubeconfig = choose_kubeconfig(opts.kubeconfig)
    except NotConfigured as exc:
        parser.error(str(exc))
    return AgentConfig(
        node_name=opts.node_name,
        kubeconfig=kubeconfig,
        run_dir=Path(opts.run_dir),
        health_port=opts.health_port,
        mtu=opts.mtu,
        resync_interval_s=opts.resync_interval,
        log_level=opts.log_level,
        node_ip=opts.node_ip,
        bgp=not opts.no_bgp,
        policy=not opts.no_policy,
        iptables_backend=opts.iptables_backend,
        endpoint_to_host=opts.endpoint_to_host,
        filter_allow=opts.filter_allow_action,
        pod_to_node_bgp=opts.pod_to_node_bgp,
    )


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logs.configure(config.log_level, node=config.node_name)
    try:
        datastore = Datastore.connect(config.kubeconfig)
    except NotConfigured as exc:
        print(f"tabby-node: error: {exc}", file=sys.stderr)
        return 2
    return Agent(config, datastore).run()


if __name__ == "__main__":
    raise SystemExit(main())
