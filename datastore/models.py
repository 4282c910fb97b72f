"""Typed views of Tabby's custom resources (group crd.tabby.dev, version v1).

The wire form is the Kubernetes JSON (camelCase); code uses snake_case attributes.
Schemas with validation live in manifests/crds/: the apiserver rejects bad objects,
these models only give them types.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from datastore import kinds

EncapMode = Literal["Never", "Always", "CrossSubnet"]
AffinityState = Literal["pending", "confirmed", "pendingDeletion"]


class Wire(BaseModel):
    """Base for every model: camelCase on the wire, snake_case in code, unknown keys kept."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Meta(Wire):
    """The parts of ObjectMeta Tabby reads and writes."""

    name: str
    namespace: str | None = None
    resource_version: str | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None


class Resource(Wire):
    """A custom resource: metadata plus a spec, bound to its ResourceKind."""

    KIND: ClassVar[kinds.ResourceKind]
    metadata: Meta

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def resource_version(self) -> str | None:
        return self.metadata.resource_version

    def to_wire(self) -> dict[str, Any]:
        body = super().to_wire()
        body["apiVersion"] = self.KIND.api_version
        body["kind"] = self.KIND.kind
        return body

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Self:
        return cls.model_validate(body)


class IPPoolSpec(Wire):
    cidr: str
    block_size: int = 26
    ipip_mode: EncapMode = "Never"
    vxlan_mode: EncapMode = "Never"
    nat_outgoing: bool = False
    disabled: bool = False
    node_selector: str = "all()"


class IPPool(Resource):
    KIND = kinds.IPPOOL
    spec: IPPoolSpec


class IPAMBlockSpec(Wire):
    cidr: str
    affinity: str | None = None
    affinity_claim_time: str | None = None
    # Strings, not JSON lists: the apiserver's cost per write follows the number of
    # JSON values. Codecs and formats: ipam/block.py.
    allocations: str  # per ordinal: attribute index or "-" (free), runs as "x*n"
    unallocated: str  # free ordinals, oldest-freed first, ascending runs as "a-b"
    attributes: list[str] = Field(default_factory=list)  # ipam.block.Attribute.encode()
    sequence_number: int = 0
    deleted: bool = False


class IPAMBlock(Resource):
    KIND = kinds.IPAMBLOCK
    spec: IPAMBlockSpec


class BlockAffinitySpec(Wire):
    cidr: str
    node: str
    state: AffinityState
    type: Literal["host", "virtual"] = "host"
    deleted: bool = False


class BlockAffinity(Resource):
    KIND = kinds.BLOCKAFFINITY
    spec: BlockAffinitySpec


class IPAMHandleSpec(Wire):
    handle_id: str = Field(alias="handleID")
    block: dict[str, int] = Field(default_factory=dict)
    deleted: bool = False


class IPAMHandle(Resource):
    KIND = kinds.IPAMHANDLE
    spec: IPAMHandleSpec


class IPAMConfigSpec(Wire):
    strict_affinity: bool = False
    auto_allocate_blocks: bool = True
    max_blocks_per_host: int = 0


class IPAMConfig(Resource):
    KIND = kinds.IPAMCONFIG
    spec: IPAMConfigSpec = Field(default_factory=IPAMConfigSpec)


class SecretKeyRef(Wire):
    """One key of a Secret in the agent's namespace (kube-system), as Calico names it."""

    name: str
    key: str


class BGPPassword(Wire):
    """A BGP session's TCP MD5 password, never inline: a reference to a Secret's key."""

    secret_key_ref: SecretKeyRef


class BGPConfigurationSpec(Wire):
    as_number: int = 64512
    node_to_node_mesh_enabled: bool = True
    listen_port: int = 179
    log_severity_screen: str = "Info"
    node_mesh_password: BGPPassword | None = None  # mesh and route-reflector sessions


class BGPConfiguration(Resource):
    KIND = kinds.BGPCONFIGURATION
    spec: BGPConfigurationSpec = Field(default_factory=BGPConfigurationSpec)


class BGPPeerSpec(Wire):
    node: str | None = None
    node_selector: str | None = None
    peer_ip: str | None = Field(default=None, alias="peerIP")
    as_number: int | None = None
    peer_selector: str | None = None
    source_address: str = "UseNodeIP"
    password: BGPPassword | None = None


class BGPPeer(Resource):
    KIND = kinds.BGPPEER
    spec: BGPPeerSpec


MODELS: tuple[type[Resource], ...] = (
    IPPool,
    IPAMBlock,
    BlockAffinity,
    IPAMHandle,
    IPAMConfig,
    BGPConfiguration,
    BGPPeer,
)
