"""Result building and conversion to each supported cniVersion."""

from __future__ import annotations

import ipaddress

import pytest

from cni import results
from cni.shim import CNIError


def own() -> results.Result:
    result = results.add_result(
        host_ifname="calic440f455693",
        host_mac="ee:ee:ee:ee:ee:ee",
        pod_ifname="eth0",
        pod_mac="0a:58:0a:41:00:05",
        sandbox="/var/run/netns/cni-1234",
        address=ipaddress.IPv4Interface("10.65.0.5/32"),
        mtu=1450,
    )
    result["routes"].append({"dst": "10.96.0.0/12", "gw": "169.254.1.1", "mtu": 1400})
    return result


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0"])
def test_legacy_versions_carry_ip_version_and_no_1_1_fields(version: str) -> None:
    out = results.convert(own(), version)
    assert out["cniVersion"] == version
    assert out["ips"] == [{"version": "4", "address": "10.65.0.5/32", "interface": 1}]
    assert out["interfaces"][1] == {
        "name": "eth0",
        "mac": "0a:58:0a:41:00:05",
        "sandbox": "/var/run/netns/cni-1234",
    }
    assert out["routes"][1] == {"dst": "10.96.0.0/12", "gw": "169.254.1.1"}


def test_1_0_0_drops_ip_version_and_1_1_fields() -> None:
    out = results.convert(own(), "1.0.0")
    assert out["ips"] == [{"address": "10.65.0.5/32", "interface": 1}]
    assert "mtu" not in out["interfaces"][1]
    assert "mtu" not in out["routes"][1]


def test_1_1_0_keeps_mtu() -> None:
    out = results.convert(own(), "1.1.0")
    assert out["interfaces"][1]["mtu"] == 1450
    assert out["routes"][1]["mtu"] == 1400
    assert out["routes"][0] == {"dst": "0.0.0.0/0", "gw": "169.254.1.1"}
    assert out["interfaces"][0] == {"name": "calic440f455693", "mac": "ee:ee:ee:ee:ee:ee"}


def test_ipv6_version_tag() -> None:
    result = {"ips": [{"address": "fd00::5/128", "interface": 0}], "interfaces": [{"name": "x"}]}
    assert results.convert(result, "0.4.0")["ips"][0]["version"] == "6"


def test_unsupported_target_version_is_code_1() -> None:
    with pytest.raises(CNIError) as err:
        results.convert(own(), "0.2.0")
    assert err.value.code == 1


def test_normalize_reads_a_legacy_prev_result() -> None:
    prev = {
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "eth0", "sandbox": "/x"}],
        "ips": [{"version": "4", "address": "10.0.0.2/24", "interface": 0}],
    }
    out = results.normalize(prev)
    assert out["ips"] == [{"address": "10.0.0.2/24", "interface": 0}]
    assert out["routes"] == []
    assert out["dns"] == {}
    assert prev["ips"][0]["version"] == "4"  # input untouched


def test_merge_prev_appends_and_shifts_interface_indices() -> None:
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "lo0"}],
        "ips": [{"address": "192.168.0.2/24", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
    }
    merged = results.merge_prev(prev, own())
    assert [i["name"] for i in merged["interfaces"]] == ["lo0", "calic440f455693", "eth0"]
    assert merged["ips"][1] == {"address": "10.65.0.5/32", "interface": 2}
    assert merged["routes"].count({"dst": "0.0.0.0/0", "gw": "169.254.1.1"}) == 1


def test_merge_without_prev_is_own() -> None:
    mine = own()
    assert results.merge_prev(None, mine) is mine


def test_pod_address_finds_the_sandbox_interface() -> None:
    assert results.pod_address(own(), "eth0") == "10.65.0.5/32"
    assert results.pod_address(own(), "net1") is None


def test_error_dict_shape() -> None:
    err = results.error_dict("1.0.0", 11, "try later", "socket gone")
    assert err == {"cniVersion": "1.0.0", "code": 11, "msg": "try later", "details": "socket gone"}
    wrapped = results.internal_error(ValueError("boom"))
    assert (wrapped.code, wrapped.details) == (999, "boom")
