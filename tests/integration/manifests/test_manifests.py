"""The deployment manifests against a real kube-apiserver (RBAC on), with the real kubectl.

Every manifest is applied server-side, so the apiserver's schemas, defaulting and
the IPPool's CEL rules judge it. Then each ServiceAccount's permissions are probed
with `kubectl auth can-i --as=system:serviceaccount:...`: what the component needs
must be allowed and what it must not do must be denied.

No controller-manager runs here: the DaemonSet and Deployment are only stored, and
a deleted namespace is finalized by this module itself. The CRDs belong to the
session's control plane and are never deleted.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import pytest

from bgp.config import BGP_SECRET
from controllers import main as gc_main
from datastore import incluster
from datastore.client import Datastore
from datastore.models import BlockAffinity, IPAMBlock
from ipam.allocator import IPAMAllocator
from lab.controlplane import ControlPlane
from tests.unit.datastore.serviceaccount_mount import Mount

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
MANIFESTS = REPO / "manifests"
NAMESPACE = "kube-system"
# Applied one by one, in dependency order; crds/ are already installed by the fixture.
FILES = (
    "rbac.yaml",
    "configmap.yaml",
    "daemonset.yaml",
    "controllers.yaml",
    "default-ippool.yaml",
)
CLUSTER_SCOPED = (
    ("clusterrolebinding", "tabby-node"),
    ("clusterrolebinding", "tabby-controllers"),
    ("clusterrole", "tabby-node"),
    ("clusterrole", "tabby-controllers"),
    ("ippools.crd.tabby.dev", "default-ipv4-ippool"),
)
NODE = "tabby-node"
CONTROLLERS = "tabby-controllers"


class Kubectl:
    """The control plane's own kubectl, as the admin user."""

    def __init__(self, cp: ControlPlane) -> None:
        self.binary = str(cp.bin_dir / "kubectl")
        self.kubeconfig = str(cp.kubeconfig)

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def ok(self, *args: str, stdin: str | None = None) -> str:
        result = self.run(*args, stdin=stdin)
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stderr}"
        return result.stdout

    def get(self, *args: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.ok("get", *args, "-o", "json"))
        return data


def _remove_everything(kubectl: Kubectl) -> None:
    """Delete what the module applied (kube-system itself is the cluster's and stays)."""
    for name in reversed(FILES):
        kubectl.run("delete", "--ignore-not-found", "--wait=true", "-f", str(MANIFESTS / name))


@pytest.fixture(scope="module")
def kubectl(control_plane: ControlPlane) -> Iterator[Kubectl]:
    """All manifests applied server-side; removed again (CRDs kept) after the module."""
    kubectl = Kubectl(control_plane)
    try:
        for name in FILES:
            kubectl.ok(
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=tabby-manifests-test",
                "-f",
                str(MANIFESTS / name),
            )
        yield kubectl
    finally:
        _remove_everything(kubectl)
    for kind, name in CLUSTER_SCOPED:
        assert kubectl.run("get", kind, name).returncode != 0, f"{kind}/{name} left behind"
    assert kubectl.run("get", "crd", "ippools.crd.tabby.dev").returncode == 0


# -- the objects as the apiserver stored them ----------------------------------------------


def test_namespaced_objects_are_stored(kubectl: Kubectl) -> None:
    stored = kubectl.get(
        "-n",
        NAMESPACE,
        "serviceaccounts,configmaps,daemonsets,deployments",
        "-l",
        "app.kubernetes.io/part-of=tabby",
    )
    names = {(item["kind"], item["metadata"]["name"]) for item in stored["items"]}
    assert names == {
        ("ServiceAccount", NODE),
        ("ServiceAccount", CONTROLLERS),
        ("ConfigMap", "tabby-config"),
        ("DaemonSet", NODE),
        ("Deployment", CONTROLLERS),
    }


def test_daemonset_as_stored(kubectl: Kubectl) -> None:
    ds = kubectl.get("-n", NAMESPACE, "daemonset", NODE)
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod.get("hostPID", False) is False
    assert pod["serviceAccountName"] == NODE
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"]
    [init] = pod["initContainers"]
    assert init["name"] == "install-cni"
    assert init["command"][:3] == ["tabbyctl", "cni", "install"]
    [main] = pod["containers"]
    assert main["securityContext"]["privileged"] is True
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert main["livenessProbe"]["httpGet"]["port"] == 9099
    env = {e["name"]: e for e in main["env"]}
    assert env["NODENAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    hostpaths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert hostpaths == {
        "/run/tabby",
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/lib/modules",
        "/run/xtables.lock",
        "/var/run/netns",
    }
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/var/run/netns"]["mountPropagation"] == "HostToContainer"


def test_controllers_deployment_as_stored(kubectl: Kubectl) -> None:
    deploy = kubectl.get("-n", NAMESPACE, "deployment", CONTROLLERS)
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"]["type"] == "Recreate"
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == CONTROLLERS
    assert pod.get("hostNetwork", False) is False
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_default_ippool_passes_the_crd_validation(kubectl: Kubectl) -> None:
    pool = kubectl.get("ippools.crd.tabby.dev", "default-ipv4-ippool")["spec"]
    assert pool == {
        "cidr": "10.244.0.0/16",
        "blockSize": 26,
        "ipipMode": "Never",
        "vxlanMode": "CrossSubnet",
        "natOutgoing": True,
        "disabled": False,  # defaulted by the CRD schema
        "nodeSelector": "all()",
    }


def test_whole_kustomization_is_accepted_by_the_server(kubectl: Kubectl) -> None:
    """`-k manifests/` (CRDs included) passes a server-side dry run and changes nothing."""
    out = kubectl.ok(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        "--field-manager=tabby-manifests-test",
        "-k",
        str(MANIFESTS),
    )
    applied = {line.split()[0] for line in out.splitlines() if line.strip()}
    for expected in (
        "customresourcedefinition.apiextensions.k8s.io/ippools.crd.tabby.dev",
        "customresourcedefinition.apiextensions.k8s.io/bgppeers.crd.tabby.dev",
        "daemonset.apps/tabby-node",
        "deployment.apps/tabby-controllers",
        "ippool.crd.tabby.dev/default-ipv4-ippool",
    ):
        assert expected in applied, f"{expected} missing from:\n{out}"


# -- RBAC: what each ServiceAccount can and cannot do ---------------------------------------

# (verb, resource, namespaced): namespaced resources are asked for in all namespaces,
# since the roles are cluster-wide and pods live everywhere.
Case = tuple[str, str, bool]

ALLOWED: dict[str, list[Case]] = {
    NODE: [
        *[(v, "nodes", False) for v in ("get", "list", "watch", "patch")],
        *[(v, "pods", True) for v in ("get", "list", "watch", "patch")],
        *[(v, "namespaces", False) for v in ("get", "list", "watch")],
        *[(v, "networkpolicies.networking.k8s.io", True) for v in ("get", "list", "watch")],
        *[
            (v, "clusternetworkpolicies.policy.networking.k8s.io", False)
            for v in ("get", "list", "watch")
        ],
        ("create", "events", True),
        *[(v, "nodepolicystatuses.crd.tabby.dev", False) for v in ("get", "create", "update")],
        *[
            (v, f"{r}.crd.tabby.dev", False)
            for r in ("ippools", "ipamconfigs", "bgpconfigurations", "bgppeers")
            for v in ("get", "list", "watch")
        ],
        *[
            (v, f"{r}.crd.tabby.dev", False)
            for r in ("ipamblocks", "blockaffinities", "ipamhandles")
            for v in ("get", "list", "watch", "create", "update", "delete")
        ],
    ],
    CONTROLLERS: [
        *[(v, r, r == "pods") for r in ("nodes", "pods") for v in ("get", "list", "watch")],
        *[
            (v, f"{r}.crd.tabby.dev", False)
            for r in ("ipamblocks", "blockaffinities", "ipamhandles")
            for v in ("get", "list", "watch", "update", "delete")
        ],
        *[
            (v, f"{r}.crd.tabby.dev", False)
            for r in ("ippools", "ipamconfigs")
            for v in ("get", "list")
        ],
        *[
            (v, "nodepolicystatuses.crd.tabby.dev", False)
            for v in ("get", "list", "watch", "delete")
        ],
        *[
            (v, "clusternetworkpolicies.policy.networking.k8s.io", False)
            for v in ("get", "list", "watch")
        ],
        ("update", "clusternetworkpolicies.policy.networking.k8s.io/status", False),
        *[
            (v, "networkpolicies.networking.k8s.io", True)
            for v in ("get", "list", "watch", "patch")
        ],
    ],
}

DENIED: dict[str, list[Case]] = {
    NODE: [
        ("delete", "pods", True),
        ("create", "pods", True),
        ("patch", "pods/status", True),
        ("patch", "nodes/status", False),
        ("patch", "events", True),  # issue 21: the agent only creates Events
        ("create", "pods/eviction", True),
        ("delete", "nodes", False),
        ("update", "nodes", False),
        ("patch", "namespaces", False),
        ("create", "networkpolicies.networking.k8s.io", True),
        ("get", "secrets", True),
        ("list", "secrets", True),
        ("get", "configmaps", True),
        ("create", "serviceaccounts/token", True),
        ("create", "ippools.crd.tabby.dev", False),
        ("update", "ippools.crd.tabby.dev", False),
        ("delete", "ippools.crd.tabby.dev", False),
        ("create", "ipamconfigs.crd.tabby.dev", False),
        ("update", "bgppeers.crd.tabby.dev", False),
        ("patch", "ipamblocks.crd.tabby.dev", False),
        ("deletecollection", "ipamblocks.crd.tabby.dev", False),
        ("delete", "nodepolicystatuses.crd.tabby.dev", False),
        ("list", "nodepolicystatuses.crd.tabby.dev", False),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", False),
        ("impersonate", "serviceaccounts", True),
        ("*", "*", True),
    ],
    CONTROLLERS: [
        ("create", "events", True),  # issue 21: the GC posts no Events
        ("patch", "events", True),
        ("patch", "pods", True),
        ("delete", "pods", True),
        ("patch", "nodes", False),
        ("delete", "nodes", False),
        ("get", "secrets", True),
        ("list", "namespaces", False),
        ("create", "networkpolicies.networking.k8s.io", True),
        ("delete", "networkpolicies.networking.k8s.io", True),
        ("update", "clusternetworkpolicies.policy.networking.k8s.io", False),
        ("patch", "clusternetworkpolicies.policy.networking.k8s.io", False),
        ("delete", "clusternetworkpolicies.policy.networking.k8s.io", False),
        ("create", "nodepolicystatuses.crd.tabby.dev", False),
        ("update", "nodepolicystatuses.crd.tabby.dev", False),
        ("create", "ipamblocks.crd.tabby.dev", False),
        ("create", "blockaffinities.crd.tabby.dev", False),
        ("create", "ipamhandles.crd.tabby.dev", False),
        ("create", "ippools.crd.tabby.dev", False),
        ("update", "ippools.crd.tabby.dev", False),
        ("delete", "ippools.crd.tabby.dev", False),
        ("watch", "ippools.crd.tabby.dev", False),
        ("get", "bgppeers.crd.tabby.dev", False),
        ("update", "ipamconfigs.crd.tabby.dev", False),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", False),
        ("*", "*", True),
    ],
}


def _can_i(kubectl: Kubectl, account: str, verb: str, resource: str, namespaced: bool) -> bool:
    # "pods/status" means the status subresource (kubectl would read it as a pod's name).
    resource, _, subresource = resource.partition("/")
    extra = ["--all-namespaces"] if namespaced else []
    if subresource:
        extra.append(f"--subresource={subresource}")
    result = kubectl.run(
        "auth", "can-i", f"--as=system:serviceaccount:{NAMESPACE}:{account}", verb, resource, *extra
    )
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"unexpected can-i answer {answer!r}: {result.stderr}"
    assert (result.returncode == 0) == (answer == "yes")
    return answer == "yes"


def _ids(cases: dict[str, list[Case]]) -> list[tuple[str, str, str, bool]]:
    return [(account, *case) for account, rows in cases.items() for case in rows]


@pytest.mark.parametrize(("account", "verb", "resource", "namespaced"), _ids(ALLOWED))
def test_account_can(
    kubectl: Kubectl, account: str, verb: str, resource: str, namespaced: bool
) -> None:
    assert _can_i(kubectl, account, verb, resource, namespaced), (
        f"{account} needs to {verb} {resource}"
    )


@pytest.mark.parametrize(("account", "verb", "resource", "namespaced"), _ids(DENIED))
def test_account_cannot(
    kubectl: Kubectl, account: str, verb: str, resource: str, namespaced: bool
) -> None:
    assert not _can_i(kubectl, account, verb, resource, namespaced), (
        f"{account} must not {verb} {resource}"
    )


def test_other_accounts_in_the_namespace_get_nothing(kubectl: Kubectl) -> None:
    """The grants come from Tabby's bindings to its own accounts, not from a default role."""
    for verb, resource, namespaced in (
        ("list", "ipamblocks.crd.tabby.dev", False),
        ("get", "ippools.crd.tabby.dev", False),
        ("patch", "pods", True),
        ("list", "nodes", False),
    ):
        assert not _can_i(kubectl, "default", verb, resource, namespaced)


# What every authenticated user may do (system:basic-user): not Tabby's grants.
SELF_REVIEWS = {"selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews"}


@pytest.mark.parametrize("account", [NODE, CONTROLLERS])
def test_rules_review_grants_exactly_the_table(kubectl: Kubectl, account: str) -> None:
    """The account's complete rule list (what `auth can-i --list` shows) is the ALLOWED table:
    nothing more, no wildcard, no resource names."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": NAMESPACE},
    }
    out = kubectl.ok(
        "create",
        f"--as=system:serviceaccount:{NAMESPACE}:{account}",
        "--validate=false",  # client-side schema checks would need CRD reads the account lacks
        "-o",
        "json",
        "-f",
        "-",
        stdin=json.dumps(review),
    )
    status = json.loads(out)["status"]
    assert status.get("incomplete") is not True
    granted = set()
    named = set()  # (verb, resource, name): a Role's grant on named objects in kube-system
    for rule in status["resourceRules"]:
        for group in rule.get("apiGroups", []):
            for resource in rule["resources"]:
                if resource in SELF_REVIEWS:
                    continue
                name, slash, sub = resource.partition("/")  # kubectl's "X.group/status"
                qualified = (name if not group else f"{name}.{group}") + slash + sub
                for verb in rule["verbs"]:
                    if rule.get("resourceNames"):
                        named |= {(verb, qualified, n) for n in rule["resourceNames"]}
                    else:
                        granted.add((verb, qualified))
    assert not any("*" in verb or "*" in resource for verb, resource in granted), granted
    expected = {(verb, resource) for verb, resource, _ in ALLOWED[account]}
    assert granted == expected
    # tabby-node reads one Secret, by name: its BGP passwords (issue 40)
    bgp = {(verb, "secrets", BGP_SECRET) for verb in ("get", "list", "watch")}
    assert named == (bgp if account == NODE else set())


def _service_account_mount(
    kubectl: Kubectl, control_plane: ControlPlane, tmp_path: Path, account: str
) -> tuple[Path, dict[str, str]]:
    """What kubelet gives a pod of the account: the ServiceAccount volume (a bound token
    and the cluster CA) and the service variables, here pointing at the loopback port."""
    token = kubectl.ok("create", "token", account, "-n", NAMESPACE, "--duration=10m").strip()
    ca = (control_plane.pki / "ca.crt").read_text()
    mount = Mount(tmp_path / "serviceaccount", token=token, ca_pem=ca)
    environ = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(control_plane.apiserver_port),
    }
    return mount.root, environ


def test_node_account_token_allocates_and_releases_an_address(
    kubectl: Kubectl, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """tabby-node's IPAM as it runs in the DaemonSet: in-cluster configuration from the
    ServiceAccount mount (a bound token, the CA), and only the RBAC this module applied."""
    mount, environ = _service_account_mount(kubectl, control_plane, tmp_path, NODE)
    node = "token-test-node"
    allocator = IPAMAllocator(Datastore.in_cluster(mount, environ), node)
    try:
        [address] = allocator.auto_assign(
            "k8s-pod-network.token-test", {"namespace": "default", "pod": "p"}
        )
        assert address in IPv4Network("10.244.0.0/16")
        assert allocator.release_by_handle("k8s-pod-network.token-test") == [address]
    finally:
        allocator.close()
        admin_ds = control_plane.datastore()
        for kind in (BlockAffinity, IPAMBlock):
            for obj in admin_ds.list(kind):
                if node in obj.name or getattr(obj.spec, "affinity", None) == f"host:{node}":
                    admin_ds.delete(obj, check_version=False)


def test_controllers_account_token_cleans_a_deleted_nodes_blocks(
    kubectl: Kubectl, control_plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tabby-controllers' GC as its own account, started as the Deployment starts it (no
    kubeconfig: the pod's environment and ServiceAccount mount): one pass reads every
    IPAM kind, nodes and pods, and deletes the (empty) block and the affinity of a node
    that no longer exists."""
    live, gone = "gc-live-node", "gc-gone-node"
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": live}}
    kubectl.ok("create", "-f", "-", stdin=json.dumps(node))
    admin = control_plane.datastore()
    try:
        allocator = IPAMAllocator(admin, gone)
        allocator.auto_assign("k8s-pod-network.gc-gone", {"namespace": "default", "pod": "p"})
        allocator.release_by_handle("k8s-pod-network.gc-gone")  # its pods went with it
        allocator.close()
        assert any(a.spec.node == gone for a in admin.list(BlockAffinity))
        mount, environ = _service_account_mount(kubectl, control_plane, tmp_path, CONTROLLERS)
        monkeypatch.setattr(incluster, "SERVICE_ACCOUNT_DIR", mount)
        monkeypatch.delenv("KUBECONFIG", raising=False)
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        heartbeat = tmp_path / "alive"
        assert gc_main.main(["--once", f"--heartbeat-file={heartbeat}"]) == 0
        assert heartbeat.exists()
        assert not any(a.spec.node == gone for a in admin.list(BlockAffinity))
        assert not any(b.spec.affinity == f"host:{gone}" for b in admin.list(IPAMBlock))
    finally:
        kubectl.run("delete", "node", live)
