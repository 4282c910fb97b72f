"""Kubernetes Events for what a pod's owner should see (`kubectl describe pod`)."""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import DatastoreError

log = logging.getLogger(__name__)

COMPONENT = "tabby-node"


def event_body(
    namespace: str, pod: str, reason: str, message: str, node: str, kind: str = "Warning"
) -> dict[str, object]:
    """A core/v1 Event about a Pod (pure: the caller writes it)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace},
        "reason": reason,
        "message": message[:1024],
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
    """Best effort: an Event that cannot be written is logged, never raised."""
    try:
        ds.create_raw(kinds.EVENT, event_body(namespace, pod, reason, message, node, kind))
    except DatastoreError as exc:
        log.warning("could not post event %s on %s/%s: %s", reason, namespace, pod, exc)
