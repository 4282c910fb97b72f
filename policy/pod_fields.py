"""The parts of a Pod that policy reads, so that a cache of every Pod in the
cluster holds only those.

An agent caches every Pod of the cluster (remote pods fill its ipsets). A Pod as
the apiserver sends it carries its managed fields, volumes, environment, probes,
conditions and container statuses: kilobytes per Pod that nothing in Tabby reads.
:func:`policy.parse_pod` and :func:`policy.membership.pod_facts` read only what
:func:`slim_pod` keeps (and the agent's recovery reads the UID); a field of an
unexpected type is kept as it is, so that the parsers still report it.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

METADATA = ("name", "namespace", "uid", "labels", "resourceVersion", "deletionTimestamp")
SPEC = ("nodeName", "hostNetwork")
STATUS = ("phase", "podIP", "podIPs")
CONTAINER = ("name", "ports")


def _pick(obj: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(obj, dict):
        return obj
    return {k: obj[k] for k in keys if k in obj}


def slim_pod(obj: Obj) -> Obj:
    """``obj`` with only the fields policy reads (a new dict; ``obj`` is unchanged)."""
    out: Obj = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
    if "metadata" in obj:
        out["metadata"] = _pick(obj["metadata"], METADATA)
    if "spec" in obj:
        spec = obj["spec"]
        out["spec"] = _pick(spec, SPEC)
        if isinstance(spec, dict) and "containers" in spec:
            containers = spec["containers"]
            out["spec"]["containers"] = (
                [_pick(c, CONTAINER) for c in containers]
                if isinstance(containers, list)
                else containers
            )
    if "status" in obj:
        out["status"] = _pick(obj["status"], STATUS)
    return out
