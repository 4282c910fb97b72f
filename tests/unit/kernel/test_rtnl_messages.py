"""kernel.rtnl's hand-packed messages, decoded by pyroute2's parsers (an independent reader)."""

from __future__ import annotations

import struct
from ipaddress import IPv4Address
from typing import Any

from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from kernel import rtnl as netlink


def decode(parser: Any, message: netlink.Message) -> Any:
    kind, flags, body = message
    msg = parser(struct.pack("=IHHII", 16 + len(body), kind, flags, 1, 0) + body)
    msg.decode()
    return msg


def test_new_veth_is_one_create_with_mac_mtu_up_and_the_peer_in_the_pod_netns() -> None:
    msg = decode(
        ifinfmsg, netlink.new_veth("cali0123456789a", "ee:ee:ee:ee:ee:ee", 1440, "eth0", 9)
    )
    assert msg["header"]["type"] == netlink.RTM_NEWLINK
    assert msg["header"]["flags"] & netlink.NLM_F_EXCL
    assert (msg["flags"], msg["change"]) == (netlink.IFF_UP, netlink.IFF_UP)
    assert msg.get_attr("IFLA_IFNAME") == "cali0123456789a"
    assert msg.get_attr("IFLA_ADDRESS") == "ee:ee:ee:ee:ee:ee"
    assert msg.get_attr("IFLA_MTU") == 1440
    info = msg.get_attr("IFLA_LINKINFO")
    assert info.get_attr("IFLA_INFO_KIND") == "veth"
    peer = info.get_attr("IFLA_INFO_DATA").get_attr("VETH_INFO_PEER")
    assert peer.get_attr("IFLA_IFNAME") == "eth0"
    assert peer.get_attr("IFLA_MTU") == 1440
    assert peer.get_attr("IFLA_NET_NS_FD") == 9


def test_routes_address_and_link_requests() -> None:
    gw = IPv4Address("169.254.1.1")
    default = decode(rtmsg, netlink.new_route(IPv4Address(0), 0, 5, gateway=gw))
    assert (default["dst_len"], default["table"], default["scope"]) == (0, 254, 0)
    assert default.get_attr("RTA_GATEWAY") == "169.254.1.1"
    assert default.get_attr("RTA_DST") is None
    assert default["header"]["flags"] & netlink.NLM_F_REPLACE

    host = decode(
        rtmsg,
        netlink.new_route(IPv4Address("10.1.2.3"), 32, 7, scope=253, proto=80, exclusive=True),
    )
    assert host.get_attr("RTA_DST") == "10.1.2.3" and host.get_attr("RTA_OIF") == 7
    assert (host["proto"], host["scope"], host["dst_len"]) == (80, 253, 32)
    assert host["header"]["flags"] & netlink.NLM_F_EXCL
    assert not host["header"]["flags"] & netlink.NLM_F_REPLACE

    addr = decode(ifaddrmsg, netlink.new_address(4, IPv4Address("10.1.2.3")))
    assert (addr["index"], addr["prefixlen"], addr["family"]) == (4, 32, 2)
    assert addr.get_attr("IFA_LOCAL") == addr.get_attr("IFA_ADDRESS") == "10.1.2.3"

    up = decode(ifinfmsg, netlink.set_up(4))
    assert (up["index"], up["flags"], up["change"]) == (4, 1, 1)
    assert decode(ifinfmsg, netlink.del_link("eth0")).get_attr("IFLA_IFNAME") == "eth0"


def test_parse_link_reads_what_pyroute2_encodes() -> None:
    msg = ifinfmsg()
    msg["index"], msg["flags"] = 12, 1
    msg["attrs"] = [
        ("IFLA_IFNAME", "caliabc"),
        ("IFLA_ADDRESS", "ee:ee:ee:ee:ee:ee"),
        ("IFLA_MTU", 1500),
        ("IFLA_LINK", 3),
        ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "veth")]}),
    ]
    msg.encode()
    link = netlink.parse_link(bytes(msg.data[16:]))
    assert link == netlink.LinkInfo(12, "caliabc", "ee:ee:ee:ee:ee:ee", 1500, True, "veth", 3)
