"""CNI results and errors for the node agent (standard library only).

The agent builds every result in one internal shape (the 1.1.0 layout) and
converts it at the edge to the version the caller's config names, so handler
code never branches on versions. Conversion rules (SPEC.md per version):

- 0.3.1 / 0.4.0: each ``ips`` entry carries ``version`` ("4"/"6"); interfaces
  have only name/mac/sandbox; routes only dst/gw.
- 1.0.0: ``ips[].version`` is gone; the 1.1.0 additions are still absent.
- 1.1.0: interfaces may carry ``mtu``/``socketPath``/``pciID``; routes
  ``mtu``/``advmss``/``priority``/``table``/``scope``.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from cni.shim import (
    ERR_INCOMPATIBLE_VERSION,
    ERR_INTERNAL,
    SUPPORTED_VERSIONS,
    CNIError,
    version_at_least,
)

__all__ = [
    "GATEWAY",
    "CNIError",
    "add_result",
    "convert",
    "error_dict",
    "merge_prev",
    "normalize",
]

Result = dict[str, Any]

GATEWAY = "169.254.1.1"
_IFACE_KEYS_1_1 = ("mtu", "socketPath", "pciID")
_ROUTE_KEYS_1_1 = ("mtu", "advmss", "priority", "table", "scope")


def error_dict(version: str, code: int, msg: str, details: str = "") -> Result:
    """The spec's error object."""
    return CNIError(code, msg, details).to_dict(version)


def internal_error(exc: BaseException) -> CNIError:
    """Wrap an unexpected exception so the runtime still gets spec JSON."""
    return CNIError(ERR_INTERNAL, f"tabby agent failed: {type(exc).__name__}", str(exc))


def add_result(
    *,
    host_ifname: str,
    host_mac: str,
    pod_ifname: str,
    pod_mac: str,
    sandbox: str,
    address: ipaddress.IPv4Interface,
    mtu: int,
) -> Result:
    """Tabby's own ADD result: host veth first, pod interface second (ips point at it)."""
    return {
        "cniVersion": SUPPORTED_VERSIONS[-1],
        "interfaces": [
            {"name": host_ifname, "mac": host_mac},
            {"name": pod_ifname, "mac": pod_mac, "mtu": mtu, "sandbox": sandbox},
        ],
        "ips": [{"address": str(address), "interface": 1}],
        "routes": [{"dst": "0.0.0.0/0", "gw": GATEWAY}],
        "dns": {},
    }


def normalize(result: Result) -> Result:
    """Read a result (e.g. prevResult) of any supported version into the internal shape."""
    out: Result = {k: v for k, v in result.items() if k != "cniVersion"}
    out["cniVersion"] = SUPPORTED_VERSIONS[-1]
    out["interfaces"] = [dict(i) for i in result.get("interfaces") or []]
    out["ips"] = [{k: v for k, v in ip.items() if k != "version"} for ip in result.get("ips") or []]
    out["routes"] = [dict(r) for r in result.get("routes") or []]
    out.setdefault("dns", {})
    return out


def merge_prev(prev: Result | None, own: Result) -> Result:
    """Chain after an earlier plugin: keep its result and append ours (indices shifted)."""
    if not prev:
        return own
    base = normalize(prev)
    offset = len(base["interfaces"])
    base["interfaces"].extend(own["interfaces"])
    for ip in own["ips"]:
        shifted = dict(ip)
        if "interface" in shifted:
            shifted["interface"] += offset
        base["ips"].append(shifted)
    base["routes"].extend(r for r in own["routes"] if r not in base["routes"])
    return base


def _ip_version(address: str) -> str:
    return str(ipaddress.ip_interface(address).version)


def convert(result: Result, version: str) -> Result:
    """Render an internal result for a caller speaking *version*."""
    if version not in SUPPORTED_VERSIONS:
        raise CNIError(ERR_INCOMPATIBLE_VERSION, f"cannot convert result to cniVersion {version}")
    new = version_at_least(version, "1.1.0")
    legacy = not version_at_least(version, "1.0.0")
    interfaces = [
        {k: v for k, v in i.items() if new or k not in _IFACE_KEYS_1_1}
        for i in result.get("interfaces", [])
    ]
    ips = []
    for ip in result.get("ips", []):
        entry = {k: v for k, v in ip.items() if k != "version"}
        if legacy:
            entry = {"version": _ip_version(ip["address"]), **entry}
        ips.append(entry)
    routes = [
        {k: v for k, v in r.items() if new or k not in _ROUTE_KEYS_1_1}
        for r in result.get("routes", [])
    ]
    out: Result = {"cniVersion": version, "interfaces": interfaces, "ips": ips}
    out["routes"] = routes
    out["dns"] = dict(result.get("dns") or {})
    return out


def pod_address(result: Result, ifname: str) -> str | None:
    """The first address a result gives the pod interface *ifname* (CIDR text)."""
    interfaces = result.get("interfaces") or []
    for ip in result.get("ips") or []:
        index = ip.get("interface")
        if (
            isinstance(index, int)
            and 0 <= index < len(interfaces)
            and interfaces[index].get("name") == ifname
            and interfaces[index].get("sandbox")
        ):
            return str(ip.get("address"))
    return None
