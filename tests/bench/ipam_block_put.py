"""What one IPAMBlock write costs kube-apiserver, Tabby's wire form against Calico's.

Standalone: starts its own control plane, registers two peer CRDs beside Tabby's
real one, and PUTs the same half-full /26 (32 pods, one allocation call each) in
three shapes, interleaved in rounds so that machine drift hits all alike:
  tabby         the IPAMBlock CRD in manifests/, written by ipam.block's codec;
  tabby-lists   the same, with `allocations` / `unallocated` as JSON lists (stop 12);
  calico        Calico's shape: lists, attribute objects with a `secondary` map,
                and the per-ordinal `sequenceNumberForAllocation` map.
The apiserver's CPU per PUT is read from /proc; latency is the client's wall time.
The last line printed is exactly:
  ipam-block-put tabby_cpu_ms=X lists_cpu_ms=Y calico_cpu_ms=Z tabby_vs_calico=R

Run: .venv/bin/python tests/bench/ipam_block_put.py [--rounds N] [--puts N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from datastore.errors import DatastoreError  # noqa: E402
from datastore.models import IPAMBlock, Meta  # noqa: E402
from datastore.transport import Transport  # noqa: E402
from ipam.block import AllocationBlock, host_affinity  # noqa: E402
from lab.controlplane import ControlPlane  # noqa: E402
from tests.bench.ipam_bench import percentile  # noqa: E402

GROUP = "bench.tabby.dev"
CIDR = "10.96.0.0/26"
PODS = 32
NODE = "bench-node"


def pod(i: int) -> tuple[str, dict[str, str]]:
    """A handle and the attributes Tabby's CNI server stores for a pod."""
    return f"k8s-pod-network.{i:064x}", {
        "ifname": "eth0",
        "namespace": "bench",
        "node": NODE,
        "pod": f"web-{i}-7d9f8b6c5-x2k4q",
    }


def tabby_block() -> AllocationBlock:
    block = AllocationBlock.new(CIDR, host_affinity(NODE), "2026-12-03T09:00:00Z")
    for i in range(PODS):
        block.auto_assign(1, *pod(i))
    return block


def tabby_spec(block: AllocationBlock) -> dict[str, Any]:
    return IPAMBlock(metadata=Meta(name="b"), spec=block.to_spec()).to_wire()["spec"]


def lists_spec(block: AllocationBlock) -> dict[str, Any]:
    spec = tabby_spec(block)
    spec["allocations"] = list(block.allocations)
    spec["unallocated"] = list(block.unallocated)
    return spec


def calico_spec(block: AllocationBlock) -> dict[str, Any]:
    """The same allocations as Calico's libcalico-go stores them."""
    return {
        "cidr": CIDR,
        "affinity": block.affinity,
        "allocations": list(block.allocations),
        "unallocated": list(block.unallocated),
        "attributes": [{"handle_id": a.handle_id, "secondary": a.attrs} for a in block.attributes],
        "sequenceNumber": block.sequence_number,
        "sequenceNumberForAllocation": {
            str(o): block.attributes[i].sequence_number
            for o, i in enumerate(block.allocations)
            if i is not None
        },
        "strictAffinity": False,
        "deleted": False,
    }


def peer_crd(plural: str, kind: str, spec_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": spec_schema},
                        }
                    },
                }
            ],
        },
    }


def lists_schema() -> dict[str, Any]:
    """Tabby's CRD schema with the two lists as they were (integer arrays)."""
    crd = yaml.safe_load((REPO / "manifests" / "crds" / "ipamblocks.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec: dict[str, Any] = schema["properties"]["spec"]
    spec["properties"]["allocations"] = {
        "type": "array",
        "maxItems": 4096,
        "items": {"type": "integer", "nullable": True, "minimum": 0},
    }
    spec["properties"]["unallocated"] = {
        "type": "array",
        "maxItems": 4096,
        "items": {"type": "integer", "minimum": 0},
    }
    return spec


def calico_schema() -> dict[str, Any]:
    """Calico's IPAMBlock schema (crd.projectcalico.org v1), descriptions left out."""
    integer_list = {"type": "array", "items": {"type": "integer"}}
    return {
        "type": "object",
        "required": ["allocations", "attributes", "cidr", "sequenceNumber", "unallocated"],
        "properties": {
            "affinity": {"type": "string"},
            "allocations": {"type": "array", "items": {"type": "integer", "nullable": True}},
            "attributes": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "handle_id": {"type": "string"},
                        "secondary": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        },
                    },
                },
            },
            "cidr": {"type": "string"},
            "deleted": {"type": "boolean"},
            "sequenceNumber": {"type": "integer", "format": "int64"},
            "sequenceNumberForAllocation": {
                "type": "object",
                "additionalProperties": {"type": "integer", "format": "int64"},
            },
            "strictAffinity": {"type": "boolean"},
            "unallocated": integer_list,
        },
    }


class Variant:
    """One object of one shape, PUT again and again with a bumped sequence number."""

    def __init__(self, name: str, collection: str, kind: str, spec: dict[str, Any]) -> None:
        self.name = name
        self.collection = collection
        self.body: dict[str, Any] = {
            "apiVersion": collection.split("/apis/")[1].rsplit("/", 1)[0],
            "kind": kind,
            "metadata": {"name": "b"},
            "spec": spec,
        }
        self.latencies_ms: list[float] = []
        self.api_cpu_s = 0.0

    def create(self, transport: Transport) -> None:
        deadline = time.monotonic() + 60
        while True:  # a fresh CRD's storage answers 'initializing' for a moment
            try:
                self.body = transport.request("POST", self.collection, body=self.body)
                return
            except DatastoreError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def put(self, transport: Transport, count: int, apiserver_pid: int) -> None:
        path = f"{self.collection}/b"
        began = cpu_seconds(apiserver_pid)
        for _ in range(count):
            self.body["spec"]["sequenceNumber"] += 1
            start = time.perf_counter()
            self.body = transport.request("PUT", path, body=self.body)
            self.latencies_ms.append((time.perf_counter() - start) * 1000)
        self.api_cpu_s += cpu_seconds(apiserver_pid) - began

    @property
    def cpu_ms_per_put(self) -> float:
        return self.api_cpu_s * 1000 / len(self.latencies_ms)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--puts", type=int, default=150, help="per variant per round")
    args = parser.parse_args()
    block = tabby_block()
    with (
        tempfile.TemporaryDirectory(prefix="ipam-block-put-") as workdir,
        ControlPlane.start(Path(workdir)) as cp,
    ):
        transport = cp.datastore().transport
        peers = Path(workdir) / "peer-crds"
        peers.mkdir()
        for plural, kind, schema in (
            ("listblocks", "ListBlock", lists_schema()),
            ("calicoblocks", "CalicoBlock", calico_schema()),
        ):
            (peers / f"{plural}.yaml").write_text(yaml.safe_dump(peer_crd(plural, kind, schema)))
        cp.install_crds(peers)
        variants = [
            Variant("tabby", "/apis/crd.tabby.dev/v1/ipamblocks", "IPAMBlock", tabby_spec(block)),
            Variant("tabby-lists", f"/apis/{GROUP}/v1/listblocks", "ListBlock", lists_spec(block)),
            Variant("calico", f"/apis/{GROUP}/v1/calicoblocks", "CalicoBlock", calico_spec(block)),
        ]
        assert cp.apiserver is not None and cp.apiserver.pid is not None
        for variant in variants:
            variant.create(transport)
            variant.put(transport, 20, cp.apiserver.pid)  # warm-up, not counted
            variant.latencies_ms.clear()
            variant.api_cpu_s = 0.0
        for _ in range(args.rounds):
            for variant in variants:
                variant.put(transport, args.puts, cp.apiserver.pid)
    print(f"PUT of one /26 block holding {PODS} pods, {args.rounds} x {args.puts} per shape:")
    for v in variants:
        lat = v.latencies_ms
        print(
            f"  {v.name:12} spec {len(json.dumps(v.body['spec'])):5} B  "
            f"apiserver CPU {v.cpu_ms_per_put:.2f} ms/PUT  "
            f"p50 {statistics.median(lat):.2f} ms  p99 {percentile(lat, 99):.2f} ms"
        )
    tabby, lists, calico = variants
    print(
        f"ipam-block-put tabby_cpu_ms={tabby.cpu_ms_per_put:.2f} "
        f"lists_cpu_ms={lists.cpu_ms_per_put:.2f} calico_cpu_ms={calico.cpu_ms_per_put:.2f} "
        f"tabby_vs_calico={tabby.cpu_ms_per_put / calico.cpu_ms_per_put:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
