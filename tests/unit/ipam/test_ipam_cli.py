"""`tabbyctl ipam` through click's CliRunner over the in-memory datastore."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from conftest import add_node, add_pod, add_pool, set_config

from datastore.client import Datastore
from datastore.memory import MemoryTransport
from ipam.allocator import IPAMAllocator
from tabbyctl.ipam import ipam
from tabbyctl.main import SUBCOMMANDS, Context


def run(ds: Datastore, *args: str) -> Result:
    context = Context("/nonexistent/kubeconfig")
    context._datastore = ds
    return CliRunner().invoke(ipam, list(args), obj=context, catch_exceptions=False)


def snapshot(transport: MemoryTransport) -> dict[Any, Any]:
    return copy.deepcopy(transport._objects)


@pytest.fixture
def populated(ds: Datastore) -> Datastore:
    add_pool(ds, "default", "10.0.0.0/26")
    add_pool(ds, "spare", "10.1.0.0/24", disabled=True)
    add_node(ds, "n1")
    add_node(ds, "n2")
    add_pod(ds, "ns", "a")
    IPAMAllocator(ds, "n1", config_ttl=0).auto_assign("h-a", {"namespace": "ns", "pod": "a"})
    IPAMAllocator(ds, "n2", config_ttl=0).auto_assign("h-b", {"namespace": "ns", "pod": "b"}, 2)
    return ds


def test_registered_in_tabbyctl() -> None:
    assert SUBCOMMANDS["ipam"] == "tabbyctl.ipam:ipam"


def test_show_table(populated: Datastore) -> None:
    result = run(populated, "show")
    assert result.exit_code == 0, result.output
    assert "GROUPING" in result.output and "IPS IN USE" in result.output
    assert "10.0.0.0/26" in result.output and "3 (5%)" in result.output
    assert "IP Pool (disabled)" in result.output


def test_show_json_and_yaml(populated: Datastore) -> None:
    data = json.loads(run(populated, "show", "-o", "json").output)
    assert [(p["name"], p["total"], p["in_use"], p["free"]) for p in data] == [
        ("default", 64, 3, 61),
        ("spare", 256, 0, 256),
    ]
    assert "blocks" not in data[0]
    with_blocks = yaml.safe_load(run(populated, "show", "--show-blocks", "-o", "yaml").output)
    assert with_blocks[0]["blocks"] == [
        {"cidr": "10.0.0.0/26", "owner": "n1", "in_use": 3, "free": 61}
    ]


def test_show_blocks_table(populated: Datastore) -> None:
    result = run(populated, "show", "--show-blocks")
    assert "Block (n1)" in result.output


def test_show_borrowed(populated: Datastore) -> None:
    result = run(populated, "show", "--show-borrowed")
    assert result.exit_code == 0
    assert "BORROWING-NODE" in result.output and "ns/b" in result.output
    data = json.loads(run(populated, "show", "--show-borrowed", "-o", "json").output)
    assert {(d["borrowing_node"], d["block_owner"], d["type"]) for d in data} == {
        ("n2", "n1", "pod")
    }
    assert len(data) == 2


def test_show_configuration(populated: Datastore) -> None:
    set_config(populated, strict_affinity=True, max_blocks_per_host=4)
    data = json.loads(run(populated, "show", "--show-configuration", "-o", "json").output)
    assert data == {"strictAffinity": True, "autoAllocateBlocks": True, "maxBlocksPerHost": 4}
    assert "strictAffinity" in run(populated, "show", "--show-configuration").output


def test_show_ip(populated: Datastore) -> None:
    result = run(populated, "show", "--ip", "10.0.0.0")
    assert "IP 10.0.0.0 is in use" in result.output
    assert "Handle ID: h-a" in result.output and "  pod: a" in result.output
    assert "10.0.0.9 is not assigned" in run(populated, "show", "--ip", "10.0.0.9").output
    bad = run(populated, "show", "--ip", "nonsense")
    assert bad.exit_code == 2 and "Error:" in bad.output


def test_show_rejects_two_modes(populated: Datastore) -> None:
    result = run(populated, "show", "--show-blocks", "--show-borrowed")
    assert result.exit_code == 2 and "at most one" in result.output


def test_check_and_release_from_report(
    populated: Datastore, transport: MemoryTransport, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    result = run(populated, "check", "--report", str(report))
    assert result.exit_code == 1
    assert "Check complete; found 2 problems." in result.output
    assert "pod ns/b does not exist" in result.output
    data = json.loads(run(populated, "check", "-o", "json").output)
    assert len(data["leaks"]) == 2 and data["problems"] == []
    released = run(populated, "release", "--from-report", str(report), "-o", "json")
    assert released.exit_code == 0, released.output
    assert sorted(json.loads(released.output)["released"]) == ["10.0.0.1", "10.0.0.2"]
    clean = run(populated, "check")
    assert clean.exit_code == 0 and "found 0 problems" in clean.output
    # releasing the same report again changes nothing and says why
    again = run(populated, "release", "--from-report", str(report))
    assert again.exit_code == 0 and "no longer allocated" in again.output


def test_release_from_stale_report_keeps_reassigned(populated: Datastore, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    run(populated, "check", "--report", str(report))
    a = IPAMAllocator(populated, "n2", config_ttl=0)
    a.release_by_handle("h-b")
    a.auto_assign("filler", None, 61)
    a.auto_assign("new", None, 2)  # the leaked addresses come back to a new holder
    result = run(populated, "release", "--from-report", str(report))
    assert result.exit_code == 0
    assert "Released 0 address(es)." in result.output
    assert result.output.count("reassigned since") == 2


def test_release_ip(populated: Datastore, transport: MemoryTransport) -> None:
    result = run(populated, "release", "--ip", "10.0.0.0")
    assert result.exit_code == 0 and "Released 1" in result.output
    assert "is not assigned" in run(populated, "show", "--ip", "10.0.0.0").output


def test_release_errors_change_nothing(
    populated: Datastore, transport: MemoryTransport, tmp_path: Path
) -> None:
    before = snapshot(transport)
    cases = [
        (("release",), "exactly one"),
        (("release", "--ip", "10.0.0.1", "--from-report", "x"), "exactly one"),
        (("release", "--ip", "10.0.0.1", "--ip", "10.0.0.50"), "10.0.0.50 is not allocated"),
        (("release", "--ip", "300.1.1.1"), "300.1.1.1"),
        (("release", "--from-report", str(tmp_path / "none.json")), "cannot read report"),
    ]
    for args, message in cases:
        result = run(populated, *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output
    assert snapshot(transport) == before


def test_check_report_path_unwritable(populated: Datastore, tmp_path: Path) -> None:
    result = run(populated, "check", "--report", str(tmp_path / "no" / "dir" / "r.json"))
    assert result.exit_code == 2 and "cannot write report" in result.output
