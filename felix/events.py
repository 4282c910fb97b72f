"""Kubernetes Events for what a pod's owner should see (`kubectl describe pod`).

Everything in an Event or a log line that a runtime or a tenant supplied (container
ids, pod names, error texts quoting them) goes through :func:`sanitize` first: a
4 KB container id must not be copied into every Event and log line about it.
"""

from __future__ import annotations

import logging
import re
import socket
from typing import TYPE_CHECKING

from datastore import kinds
from datastore.errors import DatastoreError
from datastore.timestamps import now_iso

if TYPE_CHECKING:
    from datastore.client import Datastore

log = logging.getLogger(__name__)

COMPONENT = "tabby-node"
MAX_MESSAGE = 512  # what `kubectl describe` shows in full; the API allows more
MAX_TOKEN = 64  # a container id is 64 hex chars; longer runs are shortened
_LONG_TOKEN = re.compile(rf"[^\s'\"/,;:=()\[\]{{}}]{{{MAX_TOKEN + 1},}}")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def sanitize(text: str, limit: int = MAX_MESSAGE) -> str:
    """Printable, bounded text: long tokens cut to their start, then the whole to *limit*."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in str(text))
    clean = _LONG_TOKEN.sub(lambda m: f"{m.group()[:32]}...({len(m.group())} chars)", clean)
    if len(clean) > limit:
        clean = f"{clean[:limit]}...({len(clean)} chars)"
    return clean


def _valid_name(value: str) -> bool:
    return len(value) <= 253 and bool(_NAME.match(value))


def event_body(
    namespace: str, pod: str, reason: str, message: str, node: str, kind: str = "Warning"
) -> dict[str, object]:
    """A core/v1 Event about a Pod (pure: the caller writes it)."""
    now = now_iso()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod[:200]}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace},
        "reason": reason,
        "message": sanitize(message),
        "type": kind,
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": f"{COMPONENT}-{node or socket.gethostname()}",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def post_pod_event(
    ds: Datastore,
    namespace: str,
    pod: str,
    reason: str,
    message: str,
    node: str,
    kind: str = "Warning",
) -> None:
    """Best effort: an Event that cannot be written is logged, never raised.

    The Pod's namespace and name come from CNI_ARGS: ones that cannot name a Pod
    get no Event (the apiserver would refuse it anyway), only a short log line.
    """
    if not (_valid_name(namespace) and _valid_name(pod)):
        log.warning(
            "no event %s: %s/%s is not a valid Pod name",
            reason,
            sanitize(namespace, 64),
            sanitize(pod, 64),
        )
        return
    try:
        ds.create_raw(kinds.EVENT, event_body(namespace, pod, reason, message, node, kind))
    except DatastoreError as exc:
        log.warning(
            "could not post event %s on %s/%s: %s", reason, namespace, pod, sanitize(str(exc))
        )
