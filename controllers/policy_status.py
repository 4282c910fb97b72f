"""Realization on the policy objects: what `kubectl get` shows of each node's progress.

Each agent publishes one NodePolicyStatus (felix/realization.py). This controller
folds them, with the Nodes, into each policy object, where a user looks:

- a ClusterNetworkPolicy gets a ``Realized`` condition in ``status.conditions``
  (``kubectl get cnp`` shows its message in the REALIZED column), written through the
  ``/status`` subresource with the resourceVersion read (a conflict waits for the
  informer's newer copy and the next pass);
- a NetworkPolicy, which has no status in networking/v1, gets the label
  ``policy.tabby.dev/realized: 3-of-3`` (``kubectl get netpol -L
  policy.tabby.dev/realized``) and the whole message in the annotation of that name.

``plan`` is pure: from the four kinds' objects it computes the writes that differ from
what the objects show (none when nothing changed). The controller runs it after
informer events, coalesced, and once per resync period; a pass makes at most
``WRITES_PER_PASS`` writes and the next one follows a second later. It also deletes the
NodePolicyStatus of a Node that no longer exists, once its agent has been silent for
``gc_after_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import Conflict, DatastoreError, NotFound
from datastore.informer import Handlers, Informer, without_managed_fields
from datastore.timestamps import age_seconds, now_iso
from policy.cluster_policy import parse_cluster_policy
from policy.errors import PolicyError
from policy.model import parse_policy
from policy.realization import (
    REALIZED_ANNOTATION,
    REALIZED_LABEL,
    NodeReport,
    Verdict,
    cluster_policy_key,
    invalid_verdict,
    networkpolicy_key,
    parse_node_health,
    parse_report,
    realization,
    realized_condition_of,
    verdict,
    version_of,
    with_realized,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]
RESYNC_S = 60.0  # a pass even without events (a missed event, a Node's health)
SETTLE_S = 0.05  # events closer than this are one pass (a burst of node reports)
SETTLE_MAX_S = 0.5  # ... but a steady stream of events still gets a pass this often
GC_AFTER_S = 300.0  # a gone Node's report is deleted once this old
WRITES_PER_PASS = 50  # the rest waits a second for the next pass: at most ~50 writes/s
MESSAGE_MAX = 1024


@dataclass(frozen=True)
class StatusWrite:
    """A ClusterNetworkPolicy's status as it should be (the object read, new conditions)."""

    name: str
    body: Obj  # the object with its resourceVersion: a compare-and-swap PUT of /status


@dataclass(frozen=True)
class MarkWrite:
    """A NetworkPolicy's label and annotation as they should be."""

    namespace: str
    name: str
    label: str
    message: str


@dataclass(frozen=True)
class ReportDelete:
    """The NodePolicyStatus of a Node that is gone (deleted only if unchanged since)."""

    name: str
    resource_version: str


@dataclass
class Plan:
    """Every write one pass makes."""

    statuses: list[StatusWrite] = field(default_factory=list)
    marks: list[MarkWrite] = field(default_factory=list)
    deletes: list[ReportDelete] = field(default_factory=list)
    skipped_reports: list[str] = field(default_factory=list)  # malformed: why

    def __len__(self) -> int:
        return len(self.statuses) + len(self.marks) + len(self.deletes)


def plan(
    reports_raw: Iterable[Obj],
    nodes_raw: Iterable[Obj],
    cluster_raw: Iterable[Obj],
    networkpolicies_raw: Iterable[Obj],
    *,
    now: str,
    now_s: float,
    gc_after_s: float = GC_AFTER_S,
) -> Plan:
    """The writes that make every policy object show its realization (pure)."""
    out = Plan()
    reports: dict[str, NodeReport] = {}
    reports_by_name: dict[str, Obj] = {}
    for raw in reports_raw:
        try:
            report = parse_report(raw)
        except PolicyError as err:
            out.skipped_reports.append(str(err))
            continue
        reports[report.node] = report
        reports_by_name[report.node] = raw
    nodes = [parse_node_health(n) for n in nodes_raw]
    for raw in cluster_raw:
        _plan_cluster(raw, reports, nodes, now, out)
    for raw in networkpolicies_raw:
        _plan_networkpolicy(raw, reports, nodes, out)
    present = {n.name for n in nodes}
    for name, raw in sorted(reports_by_name.items()):
        age = age_seconds(reports[name].updated_at, now_s)
        if name not in present and (age is None or age >= gc_after_s):
            version = str((raw.get("metadata") or {}).get("resourceVersion") or "")
            out.deletes.append(ReportDelete(name, version))
    return out


def _plan_cluster(
    raw: Obj, reports: Mapping[str, NodeReport], nodes: list[Any], now: str, out: Plan
) -> None:
    name = str(raw["metadata"]["name"])
    try:
        parse_cluster_policy(raw)
        found = verdict(realization(cluster_policy_key(name), version_of(raw), reports, nodes))
    except PolicyError as err:
        found = invalid_verdict(str(err)[:MESSAGE_MAX])
    if found.shown_by(realized_condition_of(raw), version_of(raw).generation):
        return
    body = {
        **raw,
        "status": {**(raw.get("status") or {}), "conditions": with_realized(raw, found, now)},
    }
    out.statuses.append(StatusWrite(name, body))


def _plan_networkpolicy(
    raw: Obj, reports: Mapping[str, NodeReport], nodes: list[Any], out: Plan
) -> None:
    meta = raw["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    found: Verdict
    try:
        parse_policy(raw)
        key = networkpolicy_key(namespace, name)
        found = verdict(realization(key, version_of(raw), reports, nodes))
    except PolicyError as err:
        found = invalid_verdict(str(err)[:MESSAGE_MAX])
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if labels.get(REALIZED_LABEL) == found.label and (
        annotations.get(REALIZED_ANNOTATION) == found.message
    ):
        return
    out.marks.append(MarkWrite(namespace, name, found.label, found.message))


def node_health_fields(raw: Obj) -> Obj:
    """What the realization reads of a Node (its name and conditions): a Node's images
    and addresses are most of its size, and Nodes change often."""
    meta = raw.get("metadata") or {}
    conditions = (raw.get("status") or {}).get("conditions") or []
    return {"metadata": {"name": meta.get("name")}, "status": {"conditions": conditions}}


@dataclass
class PassResult:
    written: int = 0
    conflicts: int = 0  # a status PUT that lost to a newer copy: the next pass retries
    errors: int = 0
    deleted_reports: int = 0
    deferred: int = 0  # writes left for the next pass (the budget was spent)


class PolicyStatusController:
    """Keeps every policy object's realization current, from informers' caches."""

    def __init__(
        self,
        datastore: Datastore,
        *,
        resync_s: float = RESYNC_S,
        gc_after_s: float = GC_AFTER_S,
        writes_per_pass: int = WRITES_PER_PASS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.datastore = datastore
        self.resync_s = resync_s
        self.gc_after_s = gc_after_s
        self.writes_per_pass = writes_per_pass
        self.clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.informers = self._informers()

    def _informers(self) -> dict[str, Informer]:
        """One informer per kind; ClusterNetworkPolicy's is optional (a cluster without
        its CRD has NetworkPolicy only, until the CRD is installed)."""
        handlers = Handlers(
            on_add=lambda _o: self._wake.set(),
            on_update=lambda _o, _n: self._wake.set(),
            on_delete=lambda _o: self._wake.set(),
        )
        wanted = {
            "reports": kinds.NODEPOLICYSTATUS,
            "nodes": kinds.NODE,
            "networkpolicies": kinds.NETWORKPOLICY,
            "cluster": kinds.CLUSTERNETWORKPOLICY,
        }
        return {
            role: Informer(
                self.datastore,
                kind,
                handlers,
                transform=node_health_fields if role == "nodes" else without_managed_fields,
                optional=role == "cluster",
            )
            for role, kind in wanted.items()
        }

    def start(self) -> None:
        for informer in self.informers.values():
            informer.start()
        self._thread = threading.Thread(target=self._run, name="policy-status", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        for informer in self.informers.values():
            informer.stop(timeout)
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(
            i.wait_synced(max(0.0, deadline - time.monotonic())) for i in self.informers.values()
        )

    def _run(self) -> None:
        if not self.wait_synced(timeout=300):
            log.warning("policy status: informers not synced after 300 s; passes start anyway")
        while not self._stop.is_set():
            self._settle()
            if self._stop.is_set():
                return
            try:
                result = self.run_pass()
            except Exception:
                log.exception("policy status pass failed; the next event or resync retries")
                continue
            if result.conflicts or result.errors or result.deferred:
                # Newer copies arrive by the informers, or the budget was spent (a node
                # back after many changes): go on in a second, not at once.
                self._wake.set()
                self._stop.wait(1.0)

    def _settle(self) -> None:
        """Wait for an event (or the resync period), then for the burst to end."""
        self._wake.wait(self.resync_s)
        started = time.monotonic()
        while self._wake.is_set() and time.monotonic() - started < SETTLE_MAX_S:
            self._wake.clear()
            self._stop.wait(SETTLE_S)
        self._wake.clear()

    def snapshot(self, role: str) -> list[Obj]:
        informer = self.informers.get(role)
        return list(informer.snapshot().values()) if informer else []

    def run_pass(self) -> PassResult:
        """Compute from the caches, write what differs."""
        self.passes += 1
        writes = plan(
            self.snapshot("reports"),
            self.snapshot("nodes"),
            self.snapshot("cluster"),
            self.snapshot("networkpolicies"),
            now=now_iso(),
            now_s=self.clock(),
            gc_after_s=self.gc_after_s,
        )
        for reason in writes.skipped_reports:
            log.warning("policy status: skipping a node's report: %s", reason)
        result = PassResult()
        steps: list[tuple[str, Callable[[Any], None], Any]] = [
            *[(f"clusternetworkpolicy {w.name}", self._put_status, w) for w in writes.statuses],
            *[(f"networkpolicy {w.namespace}/{w.name}", self._mark, w) for w in writes.marks],
            *[(f"nodepolicystatus {w.name}", self._delete_report, w) for w in writes.deletes],
        ]
        result.deferred = max(0, len(steps) - self.writes_per_pass)
        for what, fn, arg in steps[: self.writes_per_pass]:
            if self._write(result, what, fn, arg) and isinstance(arg, ReportDelete):
                result.deleted_reports += 1
        if len(writes):
            log.info(
                "policy status pass",
                extra={
                    "cluster_policies": len(writes.statuses),
                    "networkpolicies": len(writes.marks),
                    "deleted_reports": len(writes.deletes),
                    "conflicts": result.conflicts,
                    "errors": result.errors,
                    "deferred": result.deferred,
                },
            )
        return result

    def _write(self, result: PassResult, what: str, fn: Callable[[Any], None], arg: Any) -> bool:
        try:
            fn(arg)
        except (Conflict, NotFound):
            result.conflicts += 1  # changed or gone meanwhile: the informer brings it
            return False
        except DatastoreError as err:
            result.errors += 1
            log.warning("policy status: writing %s failed: %s", what, err)
            return False
        result.written += 1
        return True

    def _put_status(self, status: StatusWrite) -> None:
        path = kinds.CLUSTERNETWORKPOLICY.object_path(status.name) + "/status"
        self.datastore.transport.request("PUT", path, body=status.body)

    def _mark(self, mark: MarkWrite) -> None:
        patch = {
            "metadata": {
                "labels": {REALIZED_LABEL: mark.label},
                "annotations": {REALIZED_ANNOTATION: mark.message},
            }
        }
        self.datastore.patch_raw(kinds.NETWORKPOLICY, mark.name, patch, mark.namespace)

    def _delete_report(self, gone: ReportDelete) -> None:
        self.datastore.delete_raw(
            kinds.NODEPOLICYSTATUS, gone.name, resource_version=gone.resource_version or None
        )
