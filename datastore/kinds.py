"""The API resources Tabby reads and writes, and where they live in the API.

One table instead of per-kind client code: the datastore client and the informers
address every resource through a `ResourceKind`.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUP = "crd.tabby.dev"
VERSION = "v1"


@dataclass(frozen=True)
class ResourceKind:
    """Where a kind lives in the API: group/version, plural and scope."""

    kind: str
    plural: str
    group: str = GROUP
    version: str = VERSION
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str | None = None) -> str:
        """The URL path of the collection (all namespaces when namespace is None)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    def object_path(self, name: str, namespace: str | None = None) -> str:
        if self.namespaced and not namespace:
            raise ValueError(f"{self.kind} is namespaced: a namespace is required")
        return f"{self.collection_path(namespace)}/{name}"


IPPOOL = ResourceKind("IPPool", "ippools")
IPAMBLOCK = ResourceKind("IPAMBlock", "ipamblocks")
BLOCKAFFINITY = ResourceKind("BlockAffinity", "blockaffinities")
IPAMHANDLE = ResourceKind("IPAMHandle", "ipamhandles")
IPAMCONFIG = ResourceKind("IPAMConfig", "ipamconfigs")
BGPCONFIGURATION = ResourceKind("BGPConfiguration", "bgpconfigurations")
BGPPEER = ResourceKind("BGPPeer", "bgppeers")
# One per node: the policy generations its agent has programmed (policy/realization.py).
NODEPOLICYSTATUS = ResourceKind("NodePolicyStatus", "nodepolicystatuses")

NODE = ResourceKind("Node", "nodes", group="", version="v1")
POD = ResourceKind("Pod", "pods", group="", version="v1", namespaced=True)
NAMESPACE = ResourceKind("Namespace", "namespaces", group="", version="v1")
EVENT = ResourceKind("Event", "events", group="", version="v1", namespaced=True)
SECRET = ResourceKind("Secret", "secrets", group="", version="v1", namespaced=True)
NETWORKPOLICY = ResourceKind(
    "NetworkPolicy", "networkpolicies", group="networking.k8s.io", version="v1", namespaced=True
)
# sigs.k8s.io/network-policy-api's CRD (manifests/crds/clusternetworkpolicies.yaml, made
# by hack/gen-cnp-crd.sh): v1beta1 is its storage version.
CLUSTERNETWORKPOLICY = ResourceKind(
    "ClusterNetworkPolicy",
    "clusternetworkpolicies",
    group="policy.networking.k8s.io",
    version="v1beta1",
)

TABBY_KINDS = (
    IPPOOL,
    IPAMBLOCK,
    BLOCKAFFINITY,
    IPAMHANDLE,
    IPAMCONFIG,
    BGPCONFIGURATION,
    BGPPEER,
    NODEPOLICYSTATUS,
)
# Every kind manifests/crds/ defines: Tabby's own and the upstream ones it installs.
CRD_KINDS = (*TABBY_KINDS, CLUSTERNETWORKPOLICY)
