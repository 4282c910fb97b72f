"""The datastore layer against a real kube-apiserver + etcd."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import DatastoreError, Invalid
from datastore.informer import Handlers, Informer
from datastore.models import IPPool, IPPoolSpec, Meta
from datastore.transport import METADATA_LIST
from lab.controlplane import ControlPlane


def _pool(name: str, cidr: str, **spec: object) -> IPPool:
    return IPPool(metadata=Meta(name=name), spec=IPPoolSpec(cidr=cidr, **spec))  # type: ignore[arg-type]


def _eventually(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_kubectl_lists_tabby_crds(control_plane: ControlPlane) -> None:
    out = subprocess.run(
        [
            str(control_plane.bin_dir / "kubectl"),
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "get",
            "crd",
            "-o",
            "name",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listed = set(out.split())
    expected = {
        f"customresourcedefinition.apiextensions.k8s.io/{k.plural}.{k.group}"
        for k in kinds.CRD_KINDS
    }
    assert expected <= listed, f"missing CRDs: {expected - listed}"


@pytest.mark.parametrize(
    ("cidr", "block_size", "message"),
    [
        ("10.0.0.0/33", 26, "spec.cidr"),
        ("10.0.0.0/16", 33, "spec.blockSize"),
        ("10.0.0.1/16", 26, "strictly masked"),
        ("10.0.0.0/24", 20, "blockSize must not be smaller"),
    ],
)
def test_apiserver_rejects_bad_pools(
    datastore: Datastore, cidr: str, block_size: int, message: str
) -> None:
    with pytest.raises(Invalid) as err:
        datastore.create(_pool("bad-pool", cidr, block_size=block_size))
    assert message in str(err.value)
    assert datastore.try_get(IPPool, "bad-pool") is None


def test_kubectl_apply_reports_validation_message(
    control_plane: ControlPlane, tmp_path: object
) -> None:
    manifest = (
        "apiVersion: crd.tabby.dev/v1\nkind: IPPool\nmetadata: {name: wide}\n"
        "spec: {cidr: 10.0.0.0/33}\n"
    )
    proc = subprocess.run(
        [
            str(control_plane.bin_dir / "kubectl"),
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "apply",
            "-f",
            "-",
        ],
        input=manifest,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "Invalid value" in proc.stderr and "spec.cidr" in proc.stderr


def test_cas_conflict_is_retried_and_final_object_is_right(datastore: Datastore) -> None:
    datastore.create(_pool("cas", "10.10.0.0/16"))
    attempts = []

    def disable_and_race(pool: IPPool) -> IPPool:
        attempts.append(pool.resource_version)
        if len(attempts) == 1:  # another writer sneaks in between our read and write
            other = datastore.get(IPPool, "cas")
            other.spec.nat_outgoing = True
            datastore.update(other)
        pool.spec.disabled = True
        return pool

    final = datastore.mutate(IPPool, "cas", disable_and_race)
    assert final is not None
    assert len(attempts) == 2 and attempts[0] != attempts[1]
    stored = datastore.get(IPPool, "cas")
    assert stored.spec.disabled and stored.spec.nat_outgoing
    datastore.delete(stored)


def test_names_come_from_a_metadata_only_list(datastore: Datastore) -> None:
    for name, cidr in (("names-a", "10.21.0.0/16"), ("names-b", "10.22.0.0/16")):
        datastore.create(_pool(name, cidr))
    raw = datastore.transport.request("GET", kinds.IPPOOL.collection_path(), accept=METADATA_LIST)
    assert raw["kind"] == "PartialObjectMetadataList"
    assert all("spec" not in item for item in raw["items"])
    assert {"names-a", "names-b"} <= set(datastore.list_names(kinds.IPPOOL))
    for name in ("names-a", "names-b"):
        datastore.delete(datastore.get(IPPool, name))


def _service_account_token(datastore: Datastore, name: str) -> str:
    """A bound token for a ServiceAccount allowed to read IPPools (as tabby-node's is)."""
    t = datastore.transport
    t.request(
        "POST", "/api/v1/namespaces/default/serviceaccounts", body={"metadata": {"name": name}}
    )
    rules = [{"apiGroups": ["crd.tabby.dev"], "resources": ["ippools"], "verbs": ["list"]}]
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    t.request("POST", f"{rbac}/clusterroles", body={"metadata": {"name": name}, "rules": rules})
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
    }
    t.request("POST", f"{rbac}/clusterrolebindings", body=binding)
    request = {"spec": {"expirationSeconds": 3600}}
    path = f"/api/v1/namespaces/default/serviceaccounts/{name}/token"
    return str(t.request("POST", path, body=request)["status"]["token"])


def test_service_account_token_file_authenticates_and_is_reread(
    control_plane: ControlPlane, datastore: Datastore, tmp_path: Path
) -> None:
    """The DaemonSet's kubeconfig: server, CA and a tokenFile in the ServiceAccount mount."""
    token = _service_account_token(datastore, "token-file-reader")
    try:
        admin = yaml.safe_load(control_plane.kubeconfig.read_text())
        admin["users"] = [{"name": "sa", "user": {"tokenFile": "sa/token"}}]
        admin["contexts"][0]["context"]["user"] = "sa"
        (tmp_path / "sa").mkdir()
        (tmp_path / "sa" / "token").write_text("not-a-valid-token")
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(admin))
        as_sa = Datastore.from_kubeconfig(str(tmp_path / "kubeconfig"))
        with pytest.raises(DatastoreError) as refused:
            as_sa.list(IPPool)
        assert refused.value.status == 401
        (tmp_path / "sa" / "token.new").write_text(token)  # rotated, as kubelet does
        (tmp_path / "sa" / "token.new").replace(tmp_path / "sa" / "token")
        as_sa.list(IPPool)  # the same client, now authenticated as the ServiceAccount
        with pytest.raises(DatastoreError) as forbidden:
            as_sa.list_raw(kinds.NODE)
        assert forbidden.value.status == 403
        assert "system:serviceaccount:default:token-file-reader" in str(forbidden.value)
    finally:
        _delete_service_account(datastore, "token-file-reader")


def _delete_service_account(datastore: Datastore, name: str) -> None:
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    for path in (
        f"{rbac}/clusterrolebindings/{name}",
        f"{rbac}/clusterroles/{name}",
        f"/api/v1/namespaces/default/serviceaccounts/{name}",
    ):
        datastore.transport.request("DELETE", path)


class Recorder:
    """Counts informer callbacks per object name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, str]] = []

    def handlers(self) -> Handlers:
        def add(obj: dict) -> None:
            self._record("add", obj)

        def update(old: dict, new: dict) -> None:
            self._record("update", new)

        def delete(obj: dict) -> None:
            self._record("delete", obj)

        return Handlers(add, update, delete)

    def _record(self, kind: str, obj: dict) -> None:
        with self.lock:
            self.events.append((kind, obj["metadata"]["name"], obj["spec"]["cidr"]))

    def of(self, kind: str) -> list[str]:
        with self.lock:
            return sorted(name for k, name, _ in self.events if k == kind)


def _disable(pool: IPPool) -> IPPool:
    pool.spec.disabled = True
    return pool


def _names(ds: Datastore, prefix: str) -> set[str]:
    return {p.name for p in ds.list(IPPool) if p.name.startswith(prefix)}


def test_informer_resumes_after_watch_timeouts_without_relisting(datastore: Datastore) -> None:
    rec = Recorder()
    informer = Informer(datastore, kinds.IPPOOL, rec.handlers(), watch_timeout_s=1).start()
    try:
        assert informer.wait_synced(30)
        for i in range(4):
            datastore.create(_pool(f"resume-{i}", f"10.{20 + i}.0.0/16"))
            time.sleep(0.6)  # spread the writes over several watch sessions
        _eventually(lambda: len(rec.of("add")) >= 4 and informer.stats.watches >= 3)
        assert rec.of("add") == [f"resume-{i}" for i in range(4)]
        assert informer.stats.lists == 1
    finally:
        informer.stop()
        for name in _names(datastore, "resume-"):
            datastore.delete(datastore.get(IPPool, name))


def test_informer_survives_apiserver_restart_without_loss_or_duplicates(
    control_plane: ControlPlane,
) -> None:
    ds = control_plane.datastore()
    rec = Recorder()
    informer = Informer(ds, kinds.IPPOOL, rec.handlers()).start()
    try:
        assert informer.wait_synced(30)
        for i in range(3):
            ds.create(_pool(f"restart-{i}", f"10.{30 + i}.0.0/16"))
        _eventually(lambda: len(rec.of("add")) == 3)

        control_plane.stop_apiserver()  # mid-watch: the stream breaks
        time.sleep(1.0)
        control_plane.start_apiserver()

        ds = control_plane.datastore()
        for i in range(3, 6):
            ds.create(_pool(f"restart-{i}", f"10.{30 + i}.0.0/16"))
        ds.mutate(IPPool, "restart-0", _disable)
        ds.delete(ds.get(IPPool, "restart-1"))

        expected = _names(ds, "restart-")
        _eventually(
            lambda: {k for k in informer.snapshot() if k.startswith("restart-")} == expected
        )
        _eventually(lambda: rec.of("delete") == ["restart-1"])
        assert rec.of("add") == [f"restart-{i}" for i in range(6)]  # each exactly once
        assert rec.of("update") == ["restart-0"]
        assert informer.stats.errors >= 1  # it did see the outage
    finally:
        informer.stop()
        for name in _names(control_plane.datastore(), "restart-"):
            control_plane.datastore().delete(control_plane.datastore().get(IPPool, name))


def test_expired_resource_version_leads_to_relist(control_plane: ControlPlane) -> None:
    ds = control_plane.datastore()
    ds.create(_pool("gone-0", "10.40.0.0/16"))
    _, old_version = ds.list_raw(kinds.IPPOOL)
    ds.create(_pool("gone-1", "10.41.0.0/16"))
    ds.delete(ds.get(IPPool, "gone-0"))
    control_plane.compact_etcd()
    control_plane.stop_apiserver()  # a fresh watch cache cannot serve the old version either
    control_plane.start_apiserver()
    ds = control_plane.datastore()

    rec = Recorder()
    informer = Informer(ds, kinds.IPPOOL, rec.handlers(), resource_version=old_version).start()
    try:
        _eventually(lambda: informer.stats.relists_on_gone == 1 and informer.synced.is_set())
        assert informer.stats.lists == 1
        assert {k for k in informer.snapshot() if k.startswith("gone-")} == {"gone-1"}
        assert "gone-0" not in rec.of("add")
    finally:
        informer.stop()
        ds.delete(ds.get(IPPool, "gone-1"))
