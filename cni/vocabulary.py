"""Words the CNI server, the agent and the tools share, defined once: the IPAM handle
of an attachment, the Pod annotations Tabby writes, and the Pod a call names in
``CNI_ARGS``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

ANNOTATION_POD_IP = "tabby.dev/podIP"
ANNOTATION_CONTAINER_ID = "tabby.dev/containerID"


def handle_id(network: str, container_id: str) -> str:
    """The IPAM handle of one attachment: Calico's ``<network>.<containerID>``."""
    return f"{network}.{container_id}"


class PodRef(NamedTuple):
    """The Pod a CNI call is for, as the runtime names it (``""`` where it does not)."""

    namespace: str
    name: str
    uid: str


def pod_of(args: Mapping[str, str]) -> PodRef:
    """The ``K8S_POD_NAMESPACE``, ``K8S_POD_NAME`` and ``K8S_POD_UID`` of parsed ``CNI_ARGS``."""
    return PodRef(
        args.get("K8S_POD_NAMESPACE", ""), args.get("K8S_POD_NAME", ""), args.get("K8S_POD_UID", "")
    )
