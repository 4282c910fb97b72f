"""The lab: Kubernetes "nodes" as network namespaces on an underlay of bridges.

    underlay ns (tlab-<id>-ul): br0 .. br<K-1>, one bridge per subnet
    router ns   (tlab-<id>-rt): the nodes' default gateway, one leg per subnet; no pod routes
    node ns     (tlab-<id>-n<i>): eth0 on its subnet's bridge, forwarding on, lo up,
                                  127.0.0.1:<apiserver port> relayed to the control plane

Every namespace name starts with `tlab-<id>-`; the lab's state dir records who owns it,
so a new run removes whatever a crashed run left (namespaces, and the processes
inside them, by PID). Nothing here touches the host's own network namespace.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import secrets
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab import netns
from lab.process import ManagedProcess, PidRegistry
from lab.statefile import atomic_write

log = logging.getLogger(__name__)

PREFIX = "tlab-"
STATE_ROOT = Path("/run/tabby-lab")
SUBNET_BASE = ipaddress.IPv4Network("172.31.0.0/16")
ROUTER_HOST = 254
KILL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Node:
    """One lab node: its namespace, underlay address and subnet."""

    name: str
    netns: str
    address: ipaddress.IPv4Interface
    subnet_index: int

    @property
    def ip(self) -> str:
        return str(self.address.ip)


@dataclass
class Lab:
    """A set of node namespaces on an underlay; create with `Lab.create`."""

    lab_id: str
    subnets: int
    nodes: list[Node] = field(default_factory=list)
    processes: list[ManagedProcess] = field(default_factory=list)

    # -- naming -------------------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        return STATE_ROOT / self.lab_id

    def ns(self, role: str) -> str:
        return f"{PREFIX}{self.lab_id}-{role}"

    @property
    def underlay(self) -> str:
        return self.ns("ul")

    @property
    def router(self) -> str:
        return self.ns("rt")

    def subnet(self, index: int) -> ipaddress.IPv4Network:
        return list(SUBNET_BASE.subnets(new_prefix=24))[index]

    def gateway(self, index: int) -> str:
        return str(self.subnet(index)[ROUTER_HOST])

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no lab node named {name!r}; nodes: {[n.name for n in self.nodes]}")

    def namespaces(self) -> list[str]:
        return netns.list_netns(f"{PREFIX}{self.lab_id}-")

    # -- lifecycle ----------------------------------------------------------------------
    @classmethod
    def create(
        cls, nodes: int, subnets: int = 1, lab_id: str | None = None, owner_pid: int | None = None
    ) -> Lab:
        """Build the underlay and N nodes spread round-robin over K subnets."""
        if not 1 <= subnets <= nodes:
            raise ValueError(f"need 1 <= subnets ({subnets}) <= nodes ({nodes})")
        cleanup_stale()
        lab = cls(lab_id or secrets.token_hex(3), subnets)
        lab.state_dir.mkdir(parents=True, exist_ok=True)
        (lab.state_dir / "owner.pid").write_text(str(owner_pid or os.getpid()))
        try:
            lab._build_underlay()
            for i in range(nodes):
                lab.add_node(f"node{i + 1}", i % subnets)
        except BaseException:
            lab.teardown()
            raise
        return lab

    def _build_underlay(self) -> None:
        netns.add(self.underlay)
        for k in range(self.subnets):
            netns.ip(self.underlay, "link", "add", f"br{k}", "type", "bridge")
            netns.ip(self.underlay, "link", "set", f"br{k}", "up")
        # The router is every node's default gateway (as on a real network: proxy ARP
        # for the pods' 169.254.1.1 gateway needs the node to have a default route),
        # and joins the subnets when there are several. It knows no pod routes.
        netns.add(self.router)
        netns.sysctl(self.router, "net.ipv4.ip_forward", "1")
        for k in range(self.subnets):
            addr = f"{self.gateway(k)}/{self.subnet(k).prefixlen}"
            self._plug(self.router, f"s{k}", f"r{k}", k, addr)

    def _plug(self, inner_ns: str, inner_if: str, outer_if: str, subnet: int, addr: str) -> None:
        """A veth from inner_ns to bridge br<subnet> in the underlay, with an address."""
        netns.ip(
            self.underlay,
            "link",
            "add",
            outer_if,
            "type",
            "veth",
            "peer",
            "name",
            inner_if,
            "netns",
            inner_ns,
        )
        netns.ip(self.underlay, "link", "set", outer_if, "master", f"br{subnet}", "up")
        netns.ip(inner_ns, "addr", "add", addr, "dev", inner_if)
        netns.ip(inner_ns, "link", "set", inner_if, "up")

    def add_node(self, name: str, subnet: int = 0) -> Node:
        index = len(self.nodes) + 1
        node = Node(
            name=name,
            netns=self.ns(f"n{index}"),
            address=ipaddress.IPv4Interface(
                f"{self.subnet(subnet)[10 + index]}/{self.subnet(subnet).prefixlen}"
            ),
            subnet_index=subnet,
        )
        netns.add(node.netns)
        self._plug(node.netns, "eth0", f"n{index}", subnet, str(node.address))
        netns.sysctl(node.netns, "net.ipv4.ip_forward", "1")
        netns.ip(node.netns, "route", "add", "default", "via", self.gateway(subnet))
        self.nodes.append(node)
        self._save()
        return node

    def add_host(self, role: str, subnet: int = 0, host: int = 200) -> Node:
        """A non-node namespace on a subnet (an external BGP daemon, a ToR): not in `nodes`.

        It lives under the lab's prefix, so teardown removes it with the rest.
        """
        net = self.subnet(subnet)
        host_node = Node(
            name=role,
            netns=self.ns(role),
            address=ipaddress.IPv4Interface(f"{net[host]}/{net.prefixlen}"),
            subnet_index=subnet,
        )
        netns.add(host_node.netns)
        self._plug(host_node.netns, "eth0", f"h{role}"[:15], subnet, str(host_node.address))
        return host_node

    def start_process(
        self,
        name: str,
        node: Node,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        keep_mounts: bool = False,
        mountns: Path | None = None,
    ) -> ManagedProcess:
        """Run a daemon inside a node namespace; stopped by PID at teardown."""
        proc = ManagedProcess(
            name,
            argv,
            self.state_dir / f"{name}.log",
            netns=node.netns,
            env=env,
            keep_mounts=keep_mounts,
            mountns=mountns,
        )
        proc.start()
        PidRegistry(self.state_dir / "pids.json").record(proc)
        self.processes.append(proc)
        return proc

    def relay_apiserver(self, node: Node, socket_path: Path, port: int) -> ManagedProcess:
        """127.0.0.1:port inside the node namespace -> the control plane's unix socket.

        TCP_NODELAY (``nodelay``), as a client's own connection to the apiserver has:
        without it a request relayed in two writes waits for a delayed ACK (40 ms).
        """
        return self.start_process(
            f"relay-{node.name}",
            node,
            [
                "socat",
                f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,nodelay",
                f"UNIX-CONNECT:{socket_path}",
            ],
        )

    def set_owner(self, pid: int) -> None:
        """The process whose life is the lab's (a crashed run's labs are removed)."""
        atomic_write(self.state_dir / "owner.pid", str(pid))

    def teardown(self) -> None:
        """Stop every process, kill stragglers in our namespaces, delete them."""
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()
        remove_lab(self.lab_id)

    def _save(self) -> None:
        data = {
            "lab_id": self.lab_id,
            "subnets": self.subnets,
            "nodes": [
                {
                    "name": n.name,
                    "netns": n.netns,
                    "address": str(n.address),
                    "subnet": n.subnet_index,
                }
                for n in self.nodes
            ],
        }
        atomic_write(self.state_dir / "lab.json", json.dumps(data, indent=1))

    @classmethod
    def load(cls, lab_id: str) -> Lab:
        """Re-open a lab another process created (e.g. `tabbyctl lab up`)."""
        data = json.loads((STATE_ROOT / lab_id / "lab.json").read_text())
        lab = cls(data["lab_id"], data["subnets"])
        lab.nodes = [
            Node(n["name"], n["netns"], ipaddress.IPv4Interface(n["address"]), n["subnet"])
            for n in data["nodes"]
        ]
        return lab


def _kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if Path(f"/proc/{pid}").exists():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue


def remove_lab(lab_id: str) -> None:
    """Remove everything of one lab: recorded daemons, processes in its namespaces, them."""
    state = STATE_ROOT / lab_id
    PidRegistry(state / "pids.json").kill_leftovers()
    namespaces = netns.list_netns(f"{PREFIX}{lab_id}-")
    for name in namespaces:
        _kill_pids(netns.pids_in(name))
    for name in namespaces:
        netns.delete(name)
    shutil.rmtree(state, ignore_errors=True)


def _owner_alive(lab_id: str) -> bool:
    try:
        pid = int((STATE_ROOT / lab_id / "owner.pid").read_text())
    except (OSError, ValueError):
        return False
    return pid > 0 and Path(f"/proc/{pid}").exists()


def live_labs() -> list[str]:
    """Ids of labs whose owner still runs."""
    if not STATE_ROOT.is_dir():
        return []
    return sorted(p.name for p in STATE_ROOT.iterdir() if _owner_alive(p.name))


def cleanup_stale() -> list[str]:
    """Remove labs whose owner process is gone (a crashed run); return their ids."""
    ids = {name[len(PREFIX) :].split("-", 1)[0] for name in netns.list_netns(PREFIX)}
    if STATE_ROOT.is_dir():
        ids |= {p.name for p in STATE_ROOT.iterdir() if (p / "owner.pid").exists()}
    stale = sorted(i for i in ids if not _owner_alive(i))
    for lab_id in stale:
        log.warning("removing lab %s left behind by a process that is gone", lab_id)
        remove_lab(lab_id)
    return stale
