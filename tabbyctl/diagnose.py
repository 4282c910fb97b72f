"""`tabbyctl diagnose pod NS/NAME`: walk the chain an operator walks when a pod has no network.

Each step of the path a packet takes (and each piece of state behind it) is one
check, printed as `CHECK | RESULT | DETAIL | FIX TO TRY`, in the order a person
would look: the Pod object, its sandbox namespace, the veth pair, the host
route, IPAM, the routes on the other nodes, this node's BGP sessions, and
optionally the policy verdict towards another pod. The exit code is 1 when any
check FAILs, so scripts and CI can use it.

Gathering (apiserver reads, `ip -j` in namespaces, status files) happens at the
edge, in `gather_*` functions; every `check_*` function is pure over plain data
(dicts as `ip -j` prints them, datastore models), so the logic is unit-tested
without a kernel. Namespaces are only ever read here, never changed.

Where things are: `--lab DIR` reads a lab's state (node and pod namespaces, run
dirs, kubeconfig). In a cluster, pass `--node-netns`/`--pod-netns` or let the
command search `/run/netns` (the node namespace is the one holding the pod's
`cali` interface; the pod namespace is the one whose eth0 has the pod's IP).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from bgp.speaker import default_status_path
from cni.vocabulary import ANNOTATION_CONTAINER_ID, ANNOTATION_POD_IP
from datastore import kinds
from datastore.client import Datastore
from datastore.errors import NotFound
from felix.wiring import host_ifname_for
from ipam.pools import pool_containing
from ipam.report import Snapshot, find_leaks
from policy import (
    Namespace,
    NetworkPolicy,
    Pod,
    PolicyError,
    parse_namespace,
    parse_pod,
    parse_policy,
)
from policy.cluster_policy import ClusterNetworkPolicy, parse_cluster_policy
from policy.explain import explain_connection
from tabbyctl.node import load_status, process_running
from tabbyctl.output import emit_data, emit_table, fail, output_option

OK, FAIL, SKIP, WARN = "OK", "FAIL", "SKIP", "WARN"
COLUMNS = ("CHECK", "RESULT", "DETAIL", "FIX TO TRY")
NODE_ADDRESS_ANNOTATION = "tabby.dev/ipv4-address"
NETWORK_NAME = "k8s-pod-network"
POD_GATEWAY = "169.254.1.1"
POD_ROUTE_PROTO = "80"
TABBY_CONFLIST = "10-tabby.conflist"
NETNS_DIR = Path("/run/netns")
CNI_CONF_SUFFIXES = (".conf", ".conflist", ".json")


@dataclass(frozen=True)
class Check:
    """One row of the report; `fix` says what to try, not what is wrong."""

    name: str
    result: str
    detail: str
    fix: str = ""


def ok(name: str, detail: str) -> Check:
    return Check(name, OK, detail)


def bad(name: str, detail: str, fix: str) -> Check:
    return Check(name, FAIL, detail, fix)


def skip(name: str, why: str) -> Check:
    return Check(name, SKIP, why)


# ==================================================================== pure checks
@dataclass(frozen=True)
class PodFacts:
    """What later checks need from the Pod object."""

    namespace: str
    name: str
    node: str | None
    ip: str | None
    container_id: str | None


def check_pod(key: str, pod: Mapping[str, Any] | None) -> tuple[Check, PodFacts | None]:
    """The Pod exists, is scheduled, and Tabby's CNI ADD annotated it with an address."""
    name = "pod"
    if pod is None:
        return bad(name, f"pod {key} not found", "check the name: kubectl get pod -A"), None
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    cidr = annotations.get(ANNOTATION_POD_IP)
    facts = PodFacts(
        meta.get("namespace", ""),
        meta.get("name", ""),
        node,
        cidr.split("/")[0] if cidr else None,
        annotations.get(ANNOTATION_CONTAINER_ID),
    )
    if not node:
        return bad(name, f"{key} is not scheduled", "kubectl describe pod: scheduler events"), facts
    if not cidr:
        return (
            bad(
                name,
                f"{key} on {node} has no {ANNOTATION_POD_IP} annotation: CNI ADD never succeeded",
                "kubelet/containerd logs for the CNI error; tabby-node log on the node",
            ),
            facts,
        )
    phase = (pod.get("status") or {}).get("phase", "?")
    return ok(name, f"{key} on {node}, IP {cidr}, phase {phase}"), facts


def find_netns_with_ip(ip: str, eth0_addrs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Namespaces (name -> `ip -j addr show dev eth0`) whose eth0 has `ip`.

    All of them, not the first: on a machine running several labs (or with a stale
    sandbox) the same pod IP may appear twice, and guessing would check the wrong pod.
    """
    return sorted(ns for ns, links in eth0_addrs.items() if ip in _addresses(links))


def find_netns_with_link(ifname: str, links: Mapping[str, Iterable[str]]) -> list[str]:
    """Namespaces (name -> link names) holding an interface called `ifname` (all of them)."""
    return sorted(ns for ns, names in links.items() if ifname in names)


def check_pod_netns(netns: str | None, exists: bool, how: str, found: Sequence[str] = ()) -> Check:
    """Without the sandbox namespace there is no pod network to look at.

    `found` holds the search's candidates when there was a search (more than one is
    ambiguous: the command will not guess).
    """
    name = "pod netns"
    if len(found) > 1:
        return bad(
            name,
            f"{len(found)} namespaces have the pod's IP on eth0: {', '.join(found)} ({how})",
            "pass --pod-netns (or --lab); a leftover sandbox may hold the same IP",
        )
    if netns is None:
        return bad(
            name,
            f"no namespace found ({how})",
            "pass --pod-netns; check the sandbox is running (crictl pods)",
        )
    if not exists:
        return bad(name, f"{netns} does not exist ({how})", "the sandbox is gone: restart the pod")
    return ok(name, f"{netns} ({how})")


def check_node_netns(ifname: str, found: Sequence[str]) -> Check:
    """Which namespace is the node, when none was named: the one holding the pod's cali link."""
    name = "node netns"
    if len(found) > 1:
        return bad(
            name,
            f"{ifname} exists in {len(found)} namespaces: {', '.join(found)}",
            "pass --node-netns (or --lab)",
        )
    if found:
        return ok(name, f"{found[0]} holds {ifname} (searched /run/netns)")
    return ok(name, f"no namespace in /run/netns holds {ifname}: using this host's namespace")


def check_host_veth(
    ifname: str, link: Mapping[str, Any] | None, proxy_arp: str | None, where: str
) -> Check:
    """Host side of the veth: present, up (both ends), answering ARP for 169.254.1.1."""
    name = "host veth"
    fix_rewire = "recreate the pod (CNI ADD rewires it); tabby-node log for wiring errors"
    if link is None:
        return bad(name, f"{ifname} missing in {where}", fix_rewire)
    flags = set(link.get("flags") or [])
    if "UP" not in flags:
        return bad(name, f"{ifname} is down", f"ip link set {ifname} up (in {where})")
    if "LOWER_UP" not in flags and link.get("operstate") not in ("UP", "UNKNOWN"):
        return bad(name, f"{ifname} has no carrier: the pod's eth0 is down", fix_rewire)
    if proxy_arp != "1":
        return bad(
            name,
            f"{ifname} proxy_arp={proxy_arp}: the pod's ARP for {POD_GATEWAY} goes unanswered",
            f"sysctl net.ipv4.conf.{ifname}.proxy_arp=1 (in {where})",
        )
    return ok(name, f"{ifname} up, proxy_arp on, in {where}")


def check_pod_eth0(
    ip: str, addrs: Sequence[Mapping[str, Any]] | None, routes: Sequence[Mapping[str, Any]]
) -> list[Check]:
    """Inside the pod: eth0 holds the /32, and the default route goes to 169.254.1.1."""
    fix = "recreate the pod (CNI ADD configures eth0)"
    if addrs is None:
        return [bad("pod eth0", "no eth0 in the pod namespace", fix)]
    out = []
    links = list(addrs)
    held = _addresses(links, with_prefix=True)
    if f"{ip}/32" in held:
        out.append(ok("pod eth0", f"eth0 has {ip}/32"))
    else:
        out.append(bad("pod eth0", f"eth0 has {sorted(held) or 'no address'}, not {ip}/32", fix))
    default = [r for r in routes if r.get("dst") == "default"]
    if any(r.get("gateway") == POD_GATEWAY for r in default):
        out.append(ok("pod default route", f"default via {POD_GATEWAY}"))
    else:
        seen = ", ".join(f"via {r.get('gateway')} dev {r.get('dev')}" for r in default) or "none"
        out.append(bad("pod default route", f"default route: {seen}", fix))
    return out


def check_host_route(
    ip: str, ifname: str, routes: Sequence[Mapping[str, Any]], where: str
) -> Check:
    """The node reaches its own pod by a /32 via the cali interface (proto 80: Tabby's)."""
    name = "host route"
    target = ipaddress.ip_network(f"{ip}/32")
    mine = [r for r in routes if _route_net(r) == target and r.get("type", "unicast") == "unicast"]
    fix = (
        f"tabby-node repairs it on resync (restart the agent to force it); by hand: "
        f"ip route replace {ip}/32 dev {ifname} proto {POD_ROUTE_PROTO} scope link"
    )
    if not mine:
        return bad(name, f"no route to {ip}/32 in {where}", fix)
    route = mine[0]
    if route.get("dev") != ifname:
        return bad(name, f"{ip}/32 goes via dev {route.get('dev')}, not {ifname}", fix)
    if str(route.get("protocol")) != POD_ROUTE_PROTO:
        return Check(
            name,
            WARN,
            f"{ip}/32 dev {ifname} has proto {route.get('protocol')}: "
            "not Tabby's, resync may drop it",
            fix,
        )
    return ok(name, f"{ip}/32 dev {ifname} proto {POD_ROUTE_PROTO}")


def _holds(cidr: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a stored block's CIDR (possibly malformed) contains the address."""
    try:
        return address in ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return False


def check_ipam(ip: str, container_id: str | None, node: str, snapshot: Snapshot) -> list[Check]:
    """The address is allocated to this pod's handle, in a block affine to its node, in a pool."""
    address = ipaddress.ip_address(ip)
    handle_id = f"{NETWORK_NAME}.{container_id}" if container_id else None
    decoded = [block for _, block in snapshot.allocation_blocks()]
    block = next((b for b in decoded if b.contains(address)), None)  # type: ignore[arg-type]
    out: list[Check] = []
    corrupt = [(m, why) for m, why in snapshot.corrupt_blocks() if _holds(m.spec.cidr, address)]
    if block is None and corrupt:
        model, why = corrupt[0]
        return [
            bad(
                "ipam allocation",
                f"{ip} lies in IPAM block {model.spec.cidr}, which cannot be read: {why}",
                "tabbyctl ipam check; repair or delete that block",
            )
        ]
    if block is None:
        return [
            bad(
                "ipam allocation",
                f"no IPAM block contains {ip}: the address is not allocated",
                "recreate the pod; tabbyctl ipam check",
            )
        ]
    alloc = block.allocation(address)  # type: ignore[arg-type]
    if alloc is None:
        out.append(
            bad(
                "ipam allocation",
                f"{ip} is free in block {block.cidr}: another pod may get it",
                "recreate the pod so CNI ADD allocates it again",
            )
        )
    elif handle_id and alloc.handle_id != handle_id:
        out.append(
            bad(
                "ipam allocation",
                f"{ip} belongs to handle {alloc.handle_id}, not {handle_id}",
                "two pods share an address: tabbyctl ipam check; recreate this pod",
            )
        )
    elif handle_id and handle_id not in {h.spec.handle_id for h in snapshot.handles}:
        out.append(
            bad(
                "ipam allocation",
                f"{ip} is allocated to {handle_id}, but that IPAMHandle is missing",
                "tabbyctl ipam check",
            )
        )
    else:
        out.append(ok("ipam allocation", f"{ip} in block {block.cidr}, handle {alloc.handle_id}"))
    owner = block.host
    affine = {a.spec.node for a in snapshot.affinities if a.spec.cidr == str(block.cidr)}
    if owner == node and node in affine:
        out.append(ok("ipam affinity", f"block {block.cidr} affine to {node}"))
    elif owner == node:
        out.append(
            bad(
                "ipam affinity",
                f"block {block.cidr} says host:{node} but there is no BlockAffinity for it",
                "tabbyctl ipam check",
            )
        )
    else:
        out.append(
            Check(
                "ipam affinity",
                WARN,
                f"block {block.cidr} belongs to {owner or 'no node'}: {node} borrowed {ip}, "
                "other nodes route it to the block's owner unless a /32 is announced",
                "free addresses in the node's own blocks, or grow the pool",
            )
        )
    pool = pool_containing(block.cidr, snapshot.pools)
    if pool is None:
        out.append(
            bad(
                "ipam pool",
                f"no IPPool contains block {block.cidr}: routes for it are not announced",
                "recreate the IPPool (tabbyctl ipam show lists pools)",
            )
        )
    elif pool.spec.disabled:
        out.append(
            Check(
                "ipam pool",
                WARN,
                f"pool {pool.name} ({pool.spec.cidr}) is disabled",
                "new pods get no address from it",
            )
        )
    else:
        out.append(ok("ipam pool", f"pool {pool.name} ({pool.spec.cidr})"))
    return out


def check_stale_ipam(snapshot: Snapshot) -> Check:
    """Allocations whose pod is gone: they exhaust blocks and confuse the next owner of the IP."""
    name = "ipam stale"
    leaks = find_leaks(snapshot)
    if not leaks:
        return ok(name, "no allocations of pods that are gone")
    listed = ", ".join(f"{leak.ip} ({leak.handle})" for leak in leaks[:5])
    more = f" and {len(leaks) - 5} more" if len(leaks) > 5 else ""
    return Check(
        name,
        WARN,
        f"{len(leaks)} allocation(s) of pods that are gone: {listed}{more}",
        "tabbyctl ipam check -o json > r.json; tabbyctl ipam release --from-report r.json",
    )


def check_remote_route(
    ip: str, node: str, node_ip: str | None, other: str, routes: Sequence[Mapping[str, Any]]
) -> Check:
    """Another node's best route to the pod goes via the pod's node (a BGP-learned block)."""
    name = f"route on {other}"
    if node_ip is None:
        return skip(name, f"address of {node} unknown ({NODE_ADDRESS_ANNOTATION} missing)")
    address = ipaddress.ip_address(ip)
    covering = [
        r
        for r in routes
        if (net := _route_net(r)) is not None
        and address in net
        and r.get("type", "unicast") == "unicast"
        and r.get("dst") != "default"
    ]
    fix = (
        f"check BGP on {other} and {node} (tabbyctl node status); "
        "the block must be announced by its owner"
    )
    if not covering:
        return bad(name, f"{other} has no route for {ip} (only its default route)", fix)
    best = max(covering, key=lambda r: _route_net(r).prefixlen)  # type: ignore[union-attr]
    text = f"{best.get('dst')} via {best.get('gateway')} dev {best.get('dev')}"
    if best.get("gateway") != node_ip:
        return bad(name, f"{other} routes {ip} by {text}, not via {node} ({node_ip})", fix)
    return ok(name, f"{text} proto {best.get('protocol')}")


def check_bgp(node: str, doc: Mapping[str, Any] | None, running: bool) -> Check:
    """Every BGP session of the pod's node is Established (else its blocks are not announced)."""
    name = "bgp sessions"
    if doc is None:
        return bad(name, f"no bgp-status.json for {node}", "is tabby-node running? --run-dir")
    if not running:
        return bad(name, f"tabby-node on {node} is not running", "restart tabby-node on the node")
    if not doc.get("speakerRunning"):
        return bad(name, f"ExaBGP on {node} is not running", "tabby-node log: speaker errors")
    peers = doc.get("peers") or []
    if not peers:
        return Check(name, WARN, f"{node} has no BGP peers", "a one-node cluster needs none")
    down = [p for p in peers if p.get("state") != "up"]
    if down:
        text = ", ".join(
            f"{p.get('node') or p.get('address')} ({p.get('address')}) {p.get('info')}"
            for p in down
        )
        return bad(
            name,
            f"{len(down)}/{len(peers)} peer(s) of {node} not Established: {text}",
            "check the peer's tabby-node/ExaBGP and TCP 179 between the nodes",
        )
    return ok(name, f"{len(peers)} peer(s) of {node} Established")


def check_cni_confs(files: Sequence[str] | None, ours: str = TABBY_CONFLIST) -> Check:
    """The runtime uses the first config (by name) in the conf dir: it must be Tabby's.

    `files` is None when the directory does not exist.
    """
    name = "cni config"
    if files is None:
        return bad(name, "the CNI conf dir does not exist", "check --cni-conf-dir; reinstall")
    configs = sorted(f for f in files if f.endswith(CNI_CONF_SUFFIXES))
    if ours not in configs:
        return bad(name, f"{ours} not in the conf dir ({configs})", "reinstall: the init container")
    before = configs[: configs.index(ours)]
    if before:
        return Check(
            name,
            WARN,
            f"{', '.join(before)} sort(s) before {ours}: the runtime uses {before[0]}",
            "remove the other network's config, or rename ours to sort first",
        )
    rest = configs[1:]
    extra = f" (also present: {', '.join(rest)})" if rest else ""
    return ok(name, f"{ours} is first{extra}")


# ---------------------------------------------------------------- policy verdict
def check_policy(
    src: Pod,
    dst: Pod,
    namespaces: Mapping[str, Namespace],
    policies: Sequence[NetworkPolicy],
    protocol: str,
    port: int,
    cluster_policies: Sequence[ClusterNetworkPolicy] = (),
) -> list[Check]:
    """A connection needs the source's egress and the destination's ingress."""
    target = f"{dst.key}:{port}/{protocol}"
    out = []
    verdicts = explain_connection(src, dst, namespaces, policies, protocol, port, cluster_policies)
    for v in verdicts:
        name = f"policy {v.direction} ({v.subject})"
        if v.allowed:
            out.append(ok(name, f"{src.key} -> {target} allowed: {v.reason}"))
        elif v.tier == "networkpolicy":
            out.append(
                bad(
                    name,
                    f"{src.key} -> {target} denied: {v.reason}",
                    f"add an {v.direction} rule to {v.policy} for this peer and port "
                    "(kubectl get networkpolicy -o yaml)",
                )
            )
        else:
            out.append(
                bad(
                    name,
                    f"{src.key} -> {target} denied: {v.reason}",
                    f"a cluster administrator's policy decides: kubectl get {v.policy} -o yaml "
                    "(namespace owners cannot override an Admin Deny)",
                )
            )
    return out


# ---------------------------------------------------------------- helpers
def _addresses(links: Iterable[Mapping[str, Any]], *, with_prefix: bool = False) -> set[str]:
    """IPv4 addresses in `ip -j addr show` output."""
    out = set()
    for link in links:
        for info in link.get("addr_info") or []:
            if info.get("family") == "inet":
                local = info.get("local", "")
                out.add(f"{local}/{info.get('prefixlen')}" if with_prefix else local)
    return out


def _route_net(route: Mapping[str, Any]) -> ipaddress.IPv4Network | None:
    """`dst` of an `ip -j route` entry as a network ("default" and host routes included)."""
    dst = route.get("dst")
    if dst == "default":
        return ipaddress.IPv4Network("0.0.0.0/0")
    try:
        net = ipaddress.ip_network(str(dst), strict=False)
    except ValueError:
        return None
    return net if isinstance(net, ipaddress.IPv4Network) else None


def parse_port(text: str) -> tuple[int, str]:
    """`80/TCP` (protocol defaults to TCP) as (port, protocol)."""
    number, _, protocol = text.partition("/")
    protocol = (protocol or "TCP").upper()
    if (
        not number.isdigit()
        or not 1 <= int(number) <= 65535
        or protocol not in ("TCP", "UDP", "SCTP")
    ):
        raise ValueError(f"{text!r} is not PORT[/TCP|UDP|SCTP]")
    return int(number), protocol


def split_key(text: str) -> tuple[str, str]:
    """`NS/NAME` (or just NAME, in `default`)."""
    namespace, _, name = text.rpartition("/")
    return namespace or "default", name


# ==================================================================== gathering (I/O)
Runner = Callable[[Sequence[str]], str | None]


def run_cmd(argv: Sequence[str]) -> str | None:
    """stdout of a command, or None when it failed (a missing device is an answer, not a crash)."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


class Kernel:
    """Read-only `ip -j` views of a namespace (None: the namespace this command runs in)."""

    def __init__(self, runner: Runner = run_cmd) -> None:
        self.run = runner

    def _ip(self, netns: str | None, *args: str) -> Any:
        prefix = ["ip", "-n", netns] if netns else ["ip"]
        out = self.run([*prefix, "-j", *args])
        if out is None:
            return None
        try:
            return json.loads(out) if out.strip() else []
        except ValueError:
            return None

    def link(self, netns: str | None, ifname: str) -> dict[str, Any] | None:
        links = self._ip(netns, "link", "show", "dev", ifname)
        return links[0] if links else None

    def link_names(self, netns: str | None) -> list[str]:
        return [str(link.get("ifname")) for link in self._ip(netns, "link", "show") or []]

    def addrs(self, netns: str | None, ifname: str) -> list[dict[str, Any]] | None:
        return self._ip(netns, "addr", "show", "dev", ifname)

    def routes(self, netns: str | None) -> list[dict[str, Any]]:
        return self._ip(netns, "route", "show") or []

    def proxy_arp(self, netns: str | None, ifname: str) -> str | None:
        path = f"/proc/sys/net/ipv4/conf/{ifname}/proxy_arp"
        if netns is None:
            try:
                return Path(path).read_text().strip()
            except OSError:
                return None
        out = self.run(["ip", "netns", "exec", netns, "cat", path])
        return out.strip() if out is not None else None


def list_netns() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []


@dataclass
class Where:
    """Where to look: namespaces and run dirs, from options, the lab, or a search."""

    node_netns: str | None = None
    pod_netns: str | None = None
    run_dir: Path | None = None
    other_nodes: dict[str, str] = field(default_factory=dict)  # node name -> netns
    pod_netns_how: str = "--pod-netns"


def _get_raw(ds: Datastore, kind: kinds.ResourceKind, name: str, ns: str | None = None) -> Any:
    try:
        return ds.get_raw(kind, name, ns)
    except NotFound:
        return None


def _node_ip(node_obj: Mapping[str, Any] | None) -> str | None:
    annotations = ((node_obj or {}).get("metadata") or {}).get("annotations") or {}
    value = annotations.get(NODE_ADDRESS_ANNOTATION)
    return value.split("/")[0] if value else None


def diagnose_pod(
    ds: Datastore,
    key: str,
    where: Where,
    kernel: Kernel,
    *,
    to: str | None = None,
    port: tuple[int, str] = (80, "TCP"),
    cni_conf_dir: Path | None = None,
) -> list[Check]:
    """Gather facts step by step and run the pure checks; later steps skip when a gate fails."""
    namespace, name = split_key(key)
    pod_obj = _get_raw(ds, kinds.POD, name, namespace)
    first, facts = check_pod(f"{namespace}/{name}", pod_obj)
    checks = [first]
    if first.result != OK or facts is None or facts.ip is None or facts.node is None:
        return [*checks, skip("remaining checks", "the pod has no address to follow")]
    ip, node = facts.ip, facts.node
    checks += _kernel_checks(ip, host_ifname_for(namespace, name), where, kernel)

    # (5) IPAM, stale IPAM data
    snapshot = Snapshot.load(ds)
    checks += check_ipam(ip, facts.container_id, node, snapshot)
    checks.append(check_stale_ipam(snapshot))

    # (6) routes on the other nodes
    node_ip = _node_ip(_get_raw(ds, kinds.NODE, node))
    for other, other_ns in sorted(where.other_nodes.items()):
        checks.append(check_remote_route(ip, node, node_ip, other, kernel.routes(other_ns)))
    if not where.other_nodes:
        checks.append(skip("routes on other nodes", "pass --other-node-netns NAME=NETNS or --lab"))

    # (7) BGP sessions of the pod's node
    if where.run_dir is not None:
        doc = load_status(default_status_path(where.run_dir))
        checks.append(check_bgp(node, doc, doc is not None and process_running(doc)))
    else:
        checks.append(skip("bgp sessions", "pass --run-dir (the node agent's run directory)"))

    # CNI configs competing in the conf dir
    if cni_conf_dir is not None:
        files = [p.name for p in cni_conf_dir.iterdir()] if cni_conf_dir.is_dir() else None
        checks.append(check_cni_confs(files))

    # (8) policy verdict
    if to:
        checks += _policy_checks(ds, pod_obj, to, port)
    return checks


def _kernel_checks(ip: str, ifname: str, where: Where, kernel: Kernel) -> list[Check]:
    """Steps 2-4: sandbox namespace, veth pair, pod side, host route (found or searched)."""
    checks = []
    pod_netns, how, found = where.pod_netns, where.pod_netns_how, []
    if pod_netns is None:
        candidates = {ns: kernel.addrs(ns, "eth0") or [] for ns in list_netns()}
        found, how = find_netns_with_ip(ip, candidates), "searched /run/netns"
        pod_netns = found[0] if len(found) == 1 else None
    exists = pod_netns is not None and (
        Path(pod_netns).exists() if "/" in pod_netns else (NETNS_DIR / pod_netns).exists()
    )
    checks.append(check_pod_netns(pod_netns, exists, how, found))
    pod_ns_name = Path(pod_netns).name if pod_netns and exists else None

    node_netns, node_known = where.node_netns, True
    if node_netns is None:
        holders = find_netns_with_link(ifname, {ns: kernel.link_names(ns) for ns in list_netns()})
        checks.append(check_node_netns(ifname, holders))
        node_known = len(holders) <= 1
        node_netns = holders[0] if len(holders) == 1 else None
    where_text = f"netns {node_netns}" if node_netns else "this host's namespace"
    if node_known:
        link = kernel.link(node_netns, ifname)
        arp = kernel.proxy_arp(node_netns, ifname)
        checks.append(check_host_veth(ifname, link, arp, where_text))
    else:
        checks.append(skip("host veth", "node namespace ambiguous"))
    if pod_ns_name:
        checks += check_pod_eth0(ip, kernel.addrs(pod_ns_name, "eth0"), kernel.routes(pod_ns_name))
    else:
        checks.append(skip("pod eth0", "pod namespace not known"))
    if node_known:
        checks.append(check_host_route(ip, ifname, kernel.routes(node_netns), where_text))
    else:
        checks.append(skip("host route", "node namespace ambiguous"))
    return checks


def _policy_checks(
    ds: Datastore, src_obj: Mapping[str, Any], to: str, port: tuple[int, str]
) -> list[Check]:
    to_ns, to_name = split_key(to)
    dst_obj = _get_raw(ds, kinds.POD, to_name, to_ns)
    if dst_obj is None:
        return [bad("policy", f"destination pod {to_ns}/{to_name} not found", "check --to")]
    try:
        src, dst = parse_pod(src_obj), parse_pod(dst_obj)
        raw_policies, _ = ds.list_raw(kinds.NETWORKPOLICY)
        raw_namespaces, _ = ds.list_raw(kinds.NAMESPACE)
        namespaces = {n.name: n for n in map(parse_namespace, raw_namespaces)}
    except PolicyError as err:
        return [bad("policy", f"cannot evaluate: {err}", "fix the object named")]
    policies, broken = [], []
    for raw in raw_policies:
        try:
            policies.append(parse_policy(raw))
        except PolicyError as err:
            broken.append(str(err))
    cluster = []
    with contextlib.suppress(NotFound):  # no CRD: NetworkPolicy alone decides
        for raw in ds.list_raw(kinds.CLUSTERNETWORKPOLICY)[0]:
            try:
                cluster.append(parse_cluster_policy(raw))
            except PolicyError as err:
                broken.append(str(err))
    checks = check_policy(src, dst, namespaces, policies, port[1], port[0], cluster)
    if broken:
        checks.append(
            Check("policy objects", WARN, f"skipped invalid: {'; '.join(broken)}", "fix them")
        )
    return checks


# ==================================================================== CLI
@click.group("diagnose")
def diagnose() -> None:
    """Find where a pod's network breaks, step by step."""


@diagnose.command("pod")
@click.argument("pod")
@click.option(
    "--lab",
    "lab_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A lab's workdir: node/pod namespaces, run dirs and kubeconfig come from it.",
)
@click.option("--node-netns", default=None, help="Namespace of the pod's node [default: search].")
@click.option(
    "--pod-netns", default=None, help="Sandbox namespace (name or path) [default: search]."
)
@click.option(
    "--other-node-netns",
    multiple=True,
    metavar="NODE=NETNS",
    help="Another node's namespace, to check its route to the pod (repeatable).",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The pod's node agent run directory (bgp-status.json).",
)
@click.option(
    "--to", "to", default=None, metavar="NS/POD", help="Evaluate policy towards this pod."
)
@click.option(
    "--port", "port_text", default="80/TCP", show_default=True, help="PORT/PROTOCOL for --to."
)
@click.option(
    "--cni-conf-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="CNI conf dir to check for competing configs (e.g. /etc/cni/net.d).",
)
@output_option
@click.pass_context
def pod(
    ctx: click.Context,
    pod: str,
    lab_dir: Path | None,
    node_netns: str | None,
    pod_netns: str | None,
    other_node_netns: tuple[str, ...],
    run_dir: Path | None,
    to: str | None,
    port_text: str,
    cni_conf_dir: Path | None,
    output: str,
) -> None:
    """Check a pod's network from the Pod object to BGP; exit 1 if a check fails."""
    try:
        port = parse_port(port_text)
    except ValueError as err:
        fail(str(err))
        return
    where = Where(node_netns=node_netns, pod_netns=pod_netns, run_dir=run_dir)
    for item in other_node_netns:
        node_name, sep, netns = item.partition("=")
        if not sep:
            fail(f"--other-node-netns {item!r}: expected NODE=NETNS")
        where.other_nodes[node_name] = netns
    ds = _from_lab(lab_dir, pod, where) if lab_dir is not None else ctx.obj.datastore
    checks = diagnose_pod(ds, pod, where, Kernel(), to=to, port=port, cni_conf_dir=cni_conf_dir)
    failed = any(c.result == FAIL for c in checks)
    if output == "table":
        rows = [[c.name, c.result, c.detail, c.fix] for c in checks]
        emit_table(f"diagnose pod {pod}", COLUMNS, rows)
    else:
        emit_data({"pod": pod, "ok": not failed, "checks": [asdict(c) for c in checks]}, output)
    if failed:
        ctx.exit(1)


def _from_lab(lab_dir: Path, key: str, where: Where) -> Datastore:
    """Fill in what the lab knows (explicit options win) and return its datastore."""
    from lab.cluster import LabCluster  # only the lab needs it
    from lab.kubecluster import load_lab

    try:
        cluster = load_lab(lab_dir)
    except (OSError, ValueError, KeyError) as err:
        fail(f"--lab {lab_dir}: cannot read the lab ({err})")
        raise
    namespace, name = split_key(key)
    info = cluster.pods.get(f"{namespace}/{name}")
    ds = cluster.datastore()
    node = info.node if info else _pod_node(ds, namespace, name)
    if isinstance(cluster, LabCluster) and where.pod_netns is None:
        lab_pod = cluster.pods.get(f"{namespace}/{name}")
        if lab_pod:  # a real node's sandbox has no /run/netns name the checks can use
            where.pod_netns, where.pod_netns_how = lab_pod.netns, "from the lab"
    if node:
        if where.node_netns is None:
            where.node_netns = cluster.node(node).netns
        if where.run_dir is None:
            where.run_dir = cluster.run_dir(node)
        if not where.other_nodes:
            where.other_nodes = {n.name: n.netns for n in cluster.nodes if n.name != node}
    return ds


def _pod_node(ds: Datastore, namespace: str, name: str) -> str | None:
    obj = _get_raw(ds, kinds.POD, name, namespace)
    return ((obj or {}).get("spec") or {}).get("nodeName")


__all__ = ["Check", "diagnose", "diagnose_pod"]
