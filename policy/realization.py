"""Realization status: which nodes have programmed a policy's current generation.

Each node's agent publishes one NodePolicyStatus (``manifests/crds/nodepolicystatuses.yaml``):
the generation of every policy it has programmed, and which of those select a pod on
the node (the policy *applies* there). From those reports and the Nodes, a policy's
realization is computed here (pure): how many nodes it applies to (desired), how many
of them run its current generation (current), and every node still pending, with why
(no report from its agent, an older generation, the Node not Ready). ``tabbyctl policy
wait`` returns when nothing is pending.

A report names each policy's version as ``GENERATION:UID`` (the UID's first 8
characters: a policy deleted and created again under its name starts again at
generation 1, and must not pass for the old one). A node counts as realized for a
generation once its report holds that object at that generation or a later one
(``metadata.generation`` only grows). A node that has not programmed the current
generation yet counts as desired (it may come to apply it: a new subject, a new pod)
until it has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policy.errors import PolicyError

NETWORKPOLICY_PREFIX = "np/"
CLUSTERPOLICY_PREFIX = "cnp/"


def networkpolicy_key(namespace: str, name: str) -> str:
    """A NetworkPolicy's key in a node's report: ``np/NAMESPACE/NAME``."""
    return f"{NETWORKPOLICY_PREFIX}{namespace}/{name}"


def cluster_policy_key(name: str) -> str:
    """A ClusterNetworkPolicy's key in a node's report: ``cnp/NAME``."""
    return f"{CLUSTERPOLICY_PREFIX}{name}"


UID_CHARS = 8


@dataclass(frozen=True, order=True)
class Version:
    """Which object (by UID prefix) at which generation."""

    generation: int
    uid: str

    def __str__(self) -> str:
        return f"{self.generation}:{self.uid}"

    def covers(self, wanted: Version) -> bool:
        """This programmed version includes ``wanted``: the same object, as new or newer."""
        return self.uid == wanted.uid and self.generation >= wanted.generation


def version_of(raw: Mapping[str, Any]) -> Version:
    """An object's version: ``metadata.generation`` (0 when absent) and UID prefix."""
    meta = raw.get("metadata") or {}
    generation = meta.get("generation") or 0
    if not isinstance(generation, int) or generation < 0:
        generation = 0
    return Version(generation, str(meta.get("uid") or "")[:UID_CHARS])


def parse_version(text: str) -> Version:
    """``GENERATION:UID`` back into a :class:`Version`."""
    generation, sep, uid = text.partition(":")
    if not sep or not generation.isdigit():
        raise PolicyError(f"policy version {text!r} is not GENERATION:UID")
    return Version(int(generation), uid)


@dataclass(frozen=True)
class NodeReport:
    """What one node's agent has programmed."""

    node: str
    programmed: Mapping[str, Version]  # policy key -> the version programmed
    applied: frozenset[str]  # keys of the programmed policies selecting a pod here
    updated_at: str = ""

    def to_status(self) -> dict[str, Any]:
        """The NodePolicyStatus ``status`` this report is written as."""
        return {
            "programmed": {k: str(v) for k, v in sorted(self.programmed.items())},
            "applied": sorted(self.applied),
            "programmedCount": len(self.programmed),
            "appliedCount": len(self.applied),
            "updatedAt": self.updated_at,
        }


def parse_report(raw: Mapping[str, Any]) -> NodeReport:
    """A NodePolicyStatus object as a :class:`NodeReport`."""
    name = (raw.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise PolicyError("NodePolicyStatus without metadata.name")
    status = raw.get("status") or {}
    programmed = status.get("programmed")
    applied = status.get("applied")
    programmed = {} if programmed is None else programmed
    applied = [] if applied is None else applied
    if not isinstance(programmed, dict) or not isinstance(applied, list):
        raise PolicyError(f"NodePolicyStatus {name}: status.programmed or status.applied malformed")
    return NodeReport(
        node=name,
        programmed={str(k): parse_version(str(v)) for k, v in programmed.items()},
        applied=frozenset(str(k) for k in applied),
        updated_at=str(status.get("updatedAt") or ""),
    )


@dataclass(frozen=True)
class NodeHealth:
    """A Node as the realization sees it: Ready or not, and since when."""

    name: str
    ready: bool
    detail: str = ""  # e.g. "Ready=Unknown since 2026-12-06T18:00:00Z: Kubelet stopped"


def parse_node_health(raw: Mapping[str, Any]) -> NodeHealth:
    """A Node's Ready condition (a Node without one counts as not Ready)."""
    name = str((raw.get("metadata") or {}).get("name") or "")
    for condition in (raw.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            status = str(condition.get("status"))
            since = condition.get("lastTransitionTime") or "?"
            reason = condition.get("message") or condition.get("reason") or ""
            detail = f"Ready={status} since {since}" + (f": {reason}" if reason else "")
            return NodeHealth(name, status == "True", detail)
    return NodeHealth(name, False, "no Ready condition")


@dataclass(frozen=True)
class Pending:
    """A node that has not realized the generation, and why."""

    node: str
    reason: str


@dataclass(frozen=True)
class Realization:
    """A policy generation's state across the cluster's nodes."""

    key: str
    version: Version
    desired: int  # nodes it applies to (pending nodes included)
    current: int  # of those, nodes running this generation
    pending: tuple[Pending, ...]

    @property
    def done(self) -> bool:
        return not self.pending

    def summary(self) -> str:
        """``2/3 nodes`` for a column."""
        return f"{self.current}/{self.desired}"


def realization(
    key: str,
    version: Version,
    reports: Mapping[str, NodeReport],
    nodes: Iterable[NodeHealth],
) -> Realization:
    """How far ``version`` of policy ``key`` has reached on ``nodes``."""
    desired = current = 0
    pending: list[Pending] = []
    wanted = f"generation {version.generation}"
    for node in sorted(nodes, key=lambda n: n.name):
        report = reports.get(node.name)
        down = "" if node.ready else f" (node not Ready: {node.detail})"
        if report is None:
            desired += 1
            pending.append(Pending(node.name, f"its agent has published no policy status{down}"))
            continue
        seen = report.programmed.get(key)
        if seen is None or not seen.covers(version):
            desired += 1
            if seen is None:
                has = "has not programmed it"
            elif seen.uid != version.uid:
                has = "has programmed an earlier object of that name"
            else:
                has = f"has programmed generation {seen.generation}"
            pending.append(Pending(node.name, f"{has}, not {wanted} yet{down}"))
            continue
        if key in report.applied:
            desired += 1
            current += 1
    return Realization(key, version, desired, current, tuple(pending))


# -- what the policy objects carry (written by tabby-controllers) ---------------------------

REALIZED_CONDITION = "Realized"  # a ClusterNetworkPolicy's status.conditions[].type
REALIZED_LABEL = "policy.tabby.dev/realized"  # a NetworkPolicy's: `kubectl get -L` shows it
REALIZED_ANNOTATION = "policy.tabby.dev/realized"  # a NetworkPolicy's: the whole message
NAMES_SHOWN = 3  # pending nodes named in a message; the rest are counted


@dataclass(frozen=True)
class Verdict:
    """A policy's realization as its object shows it (condition, label, annotation)."""

    realized: bool
    reason: str  # AllNodesRealized, NodesPending or Invalid
    message: str
    label: str  # ``3-of-3``; ``invalid``

    def condition(
        self, generation: int, previous: Mapping[str, Any] | None, now: str
    ) -> dict[str, Any]:
        """The ``Realized`` metav1.Condition; its transition time kept while its
        status holds (the API's convention)."""
        status = "True" if self.realized else "False"
        since = now
        if previous and previous.get("status") == status and previous.get("lastTransitionTime"):
            since = str(previous["lastTransitionTime"])
        return {
            "type": REALIZED_CONDITION,
            "status": status,
            "reason": self.reason,
            "message": self.message,
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }

    def shown_by(self, condition: Mapping[str, Any] | None, generation: int) -> bool:
        """``condition`` already says this about ``generation`` (no write needed)."""
        return condition is not None and (
            condition.get("status") == ("True" if self.realized else "False")
            and condition.get("reason") == self.reason
            and condition.get("message") == self.message
            and condition.get("observedGeneration") == generation
        )


def verdict(state: Realization) -> Verdict:
    """``3/3 nodes run generation 2``, or which nodes are still behind."""
    counts = f"{state.current}/{state.desired}"
    label = f"{state.current}-of-{state.desired}"
    generation = f"generation {state.version.generation}"
    if state.done and state.desired:
        return Verdict(True, "AllNodesRealized", f"{counts} nodes run {generation}", label)
    if state.done:
        message = f"{counts} nodes: it selects no pod yet; every node runs {generation}"
        return Verdict(True, "AllNodesRealized", message, label)
    names = [p.node for p in state.pending[:NAMES_SHOWN]]
    more = len(state.pending) - len(names)
    behind = ", ".join(names) + (f" (+{more} more)" if more else "")
    return Verdict(
        False,
        "NodesPending",
        f"{counts} nodes run {generation}; behind: {behind}",
        label,
    )


def invalid_verdict(error: str) -> Verdict:
    """A policy no agent programs: it failed to parse (why, in the message)."""
    return Verdict(False, "Invalid", f"not programmed by any node: {error}", "invalid")


def realized_condition_of(raw: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's ``Realized`` condition, if it has one."""
    for condition in (raw.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == REALIZED_CONDITION:
            return condition
    return None


def with_realized(raw: Mapping[str, Any], found: Verdict, now: str) -> list[dict[str, Any]]:
    """The object's conditions with ``Realized`` set to ``found`` (others kept as they are)."""
    generation = version_of(raw).generation
    kept = [
        dict(c)
        for c in (raw.get("status") or {}).get("conditions") or []
        if isinstance(c, Mapping) and c.get("type") != REALIZED_CONDITION
    ]
    return [*kept, found.condition(generation, realized_condition_of(raw), now)]
