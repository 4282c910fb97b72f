"""Shared helpers for IPAM unit tests: an in-memory datastore and pool builders."""

from __future__ import annotations

from typing import Any

import pytest

from datastore import kinds
from datastore.client import Datastore
from datastore.memory import MemoryTransport
from datastore.models import IPAMConfig, IPAMConfigSpec, IPPool, IPPoolSpec, Meta


def make_pool(name: str, cidr: str, block_size: int = 26, **spec: Any) -> IPPool:
    return IPPool(
        metadata=Meta(name=name), spec=IPPoolSpec(cidr=cidr, block_size=block_size, **spec)
    )


def add_pool(ds: Datastore, name: str, cidr: str, block_size: int = 26, **spec: Any) -> IPPool:
    return ds.create(make_pool(name, cidr, block_size, **spec))


def set_config(ds: Datastore, **spec: Any) -> IPAMConfig:
    existing = ds.try_get(IPAMConfig, "default")
    if existing is None:
        return ds.create(IPAMConfig(metadata=Meta(name="default"), spec=IPAMConfigSpec(**spec)))
    existing.spec = IPAMConfigSpec(**spec)
    return ds.update(existing)


def add_node(ds: Datastore, name: str, labels: dict[str, str] | None = None) -> None:
    ds.create_raw(
        kinds.NODE,
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}},
    )


def add_pod(ds: Datastore, namespace: str, name: str, node: str = "") -> None:
    ds.create_raw(
        kinds.POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node},
        },
    )


@pytest.fixture
def transport() -> MemoryTransport:
    return MemoryTransport()


@pytest.fixture
def ds(transport: MemoryTransport) -> Datastore:
    return Datastore(transport)
