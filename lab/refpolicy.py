"""sig-network's reference NetworkPolicy implementation on lab nodes, in Tabby's place.

`make conformance POLICY=kube-network-policies` runs the upstream suites with Tabby's
policy engine off ($TABBY_POLICY=off: Tabby still wires pods, routes and BGP) and
`sigs.k8s.io/kube-network-policies` v0.8.0 deciding instead, so that a result can be
pinned on Tabby or on the harness. Upstream deploys it as a privileged hostNetwork
DaemonSet; here it is a plain process in each node's network namespace, because the lab
has no registry for its image (hack/build-e2e.sh --kube-network-policies builds it).

Two differences from upstream's deployment, both forced by this machine:
- It reads only in-cluster configuration: the process gets its ServiceAccount token
  and CA in a tmpfs over /run that exists only in its own private mount namespace
  (the node's /run binds are hidden from it; it needs none of them).
- This kernel lacks CONFIG_NFT_QUEUE, so the nftables `queue` rule it programs is
  refused; an iptables NFQUEUE rule (xt_NFQUEUE is built in) sends it the same packets
  its nftables chain would: new pod flows at postrouting, except the node's own
  root-owned traffic (`meta skuid 0 accept` upstream).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lab import netns

if TYPE_CHECKING:
    from lab.kubecluster import KubeCluster

VERSION = "v0.8.0"
NAME = "kube-network-policies"
NAMESPACE = "kube-system"
QUEUE = 100
CHAIN = "KNP-POSTROUTING"
METRICS = "127.0.0.1:9080"

# install.yaml of v0.8.0 without its DaemonSet: what the process may read.
RBAC = [
    {"apiVersion": "v1", "kind": "ServiceAccount",
     "metadata": {"name": NAME, "namespace": NAMESPACE}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
     "metadata": {"name": NAME},
     "rules": [
         {"apiGroups": [""], "resources": ["pods", "namespaces"],
          "verbs": ["list", "watch"]},
         {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
          "verbs": ["list", "watch"]},
     ]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
     "metadata": {"name": NAME},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
     "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]},
]  # fmt: skip


class ReferencePolicyError(RuntimeError):
    """The reference implementation could not be built or started."""


def bin_dir(repo: Path) -> Path:
    """hack/build-e2e.sh builds the binary when it is missing and prints where it is."""
    out = subprocess.run(
        [str(repo / "hack" / "build-e2e.sh"), "--kube-network-policies"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise ReferencePolicyError(f"hack/build-e2e.sh failed: {out.stderr.strip()[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def nfqueue_rules(pod_cidr: str, queue: int = QUEUE) -> list[list[str]]:
    """iptables argv (mangle table) that queue what upstream's nftables chain queues."""
    return [
        ["-t", "mangle", "-N", CHAIN],
        ["-t", "mangle", "-A", CHAIN, "-m", "owner", "--uid-owner", "0", "-j", "RETURN"],
        ["-t", "mangle", "-A", CHAIN, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
         "-j", "RETURN"],
        ["-t", "mangle", "-A", CHAIN, "-s", pod_cidr, "-j", "NFQUEUE", "--queue-num", str(queue)],
        ["-t", "mangle", "-A", CHAIN, "-d", pod_cidr, "-j", "NFQUEUE", "--queue-num", str(queue)],
        ["-t", "mangle", "-A", "POSTROUTING", "-j", CHAIN],
    ]  # fmt: skip


def process_argv(binary: Path, node: str, secrets: Path, apiserver: str, port: int) -> list[str]:
    """The command run in a node's namespaces: in-cluster credentials, then the binary."""
    sa = "/run/secrets/kubernetes.io/serviceaccount"
    # The secrets live under /run too: stage them on a tmpfs over /mnt first.
    script = " && ".join(
        [
            "mount -t tmpfs tmpfs /mnt",
            f"cp {shlex.quote(str(secrets))}/* /mnt/",
            "mount -t tmpfs tmpfs /run",
            f"mkdir -p {sa}",
            f"cp /mnt/* {sa}/",
            "umount /mnt",
            f"exec env KUBERNETES_SERVICE_HOST={apiserver} KUBERNETES_SERVICE_PORT={port} "
            f"{shlex.quote(str(binary))} --hostname-override={node} --nfqueue-id={QUEUE} "
            f"--netfilter-bug-1766-fix=false --metrics-bind-address={METRICS} --v=2",
        ]
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def start(cluster: KubeCluster, repo: Path, pod_cidr: str) -> None:
    """RBAC and a token, then on every node the NFQUEUE rules and the process."""
    assert cluster.lab is not None and cluster.cp is not None and cluster.cp.address
    binary = bin_dir(repo) / NAME
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"kind": "List", "apiVersion": "v1",
                                                          "items": RBAC}))  # fmt: skip
    token = cluster.kubectl("-n", NAMESPACE, "create", "token", NAME, "--duration=24h").strip()
    secrets = cluster.workdir / NAME
    secrets.mkdir(exist_ok=True)
    (secrets / "token").write_text(token)
    (secrets / "namespace").write_text(NAMESPACE)
    (secrets / "ca.crt").write_bytes((cluster.cp.pki / "ca.crt").read_bytes())
    from lab.controlplane import LAB_APISERVER_PORT

    for kube_node in cluster.kube_nodes:
        node = kube_node.node
        for rule in nfqueue_rules(pod_cidr):
            netns.ns_exec(node.netns, ["iptables", "-w", *rule])
        cluster.lab.start_process(
            f"{NAME}-{node.name}",
            node,
            process_argv(binary, node.name, secrets, cluster.cp.address, LAB_APISERVER_PORT),
            mountns=kube_node.mountns.path,
        )
    wait_ready(cluster)


def queue_bound(netns_name: str, queue: int = QUEUE) -> bool:
    """Whether a process listens on the NFQUEUE in that namespace (packets queued to an
    unbound queue are dropped)."""
    text = netns.ns_exec(netns_name, ["cat", "/proc/net/netfilter/nfnetlink_queue"], check=False)
    return any(line.split()[:1] == [str(queue)] for line in text.splitlines())


def wait_ready(cluster: KubeCluster, timeout: float = 60.0) -> None:
    """Until every node's process has bound its queue; names the nodes that did not."""
    deadline = time.monotonic() + timeout
    waiting = [n.node for n in cluster.kube_nodes]
    while waiting and time.monotonic() < deadline:
        waiting = [node for node in waiting if not queue_bound(node.netns)]
        if waiting:
            time.sleep(0.5)
    if waiting:
        assert cluster.lab is not None
        names = ", ".join(node.name for node in waiting)
        log = cluster.lab.state_dir / f"{NAME}-{waiting[0].name}.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
        raise ReferencePolicyError(
            f"{NAME} bound no queue {QUEUE} on {names} in {timeout:.0f}s; {log}:\n{tail}"
        )
