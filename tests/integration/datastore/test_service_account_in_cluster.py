"""Datastore.in_cluster against a real kube-apiserver, as a pod's ServiceAccount.

The ServiceAccount mount is built as kubelet builds it (a bound token from the
TokenRequest API, the cluster CA, `..data` swapped at rotation), and
KUBERNETES_SERVICE_HOST/PORT point at the control plane's loopback port.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import Forbidden, NotFound, Unauthorized
from datastore.models import IPPool
from lab.controlplane import ControlPlane
from tests.unit.datastore.serviceaccount_mount import Mount

pytestmark = pytest.mark.integration

ACCOUNT = "in-cluster-reader"
USER = f"system:serviceaccount:default:{ACCOUNT}"
RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC = f"/apis/{RBAC_GROUP}/v1"
ACCOUNTS = "/api/v1/namespaces/default/serviceaccounts"
REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


def _create_account(admin: Datastore) -> str:
    """The ServiceAccount; its uid (a recreated account has a new one)."""
    body = admin.transport.request("POST", ACCOUNTS, body={"metadata": {"name": ACCOUNT}})
    return str(body["metadata"]["uid"])


def _token(admin: Datastore) -> str:
    """A bound token, as kubelet asks for one (TokenRequest; 10 minutes is the least)."""
    request = {"spec": {"expirationSeconds": 600}}
    body = admin.transport.request("POST", f"{ACCOUNTS}/{ACCOUNT}/token", body=request)
    return str(body["status"]["token"])


def _jti(token: str) -> str:
    """The token's id, which the apiserver reports as the request's credential id."""
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims["jti"])


def _credential(ds: Datastore) -> str:
    """Which token the apiserver saw on this request (SelfSubjectReview)."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    user = ds.transport.request("POST", REVIEWS, body=review)["status"]["userInfo"]
    assert user["username"] == USER
    [credential] = user["extra"][CREDENTIAL_ID]
    return str(credential)


@pytest.fixture
def account(datastore: Datastore) -> Iterator[None]:
    """A ServiceAccount that may list and watch IPPools, and nothing else of Tabby's."""
    rules = [{"apiGroups": ["crd.tabby.dev"], "resources": ["ippools"], "verbs": ["list", "watch"]}]
    binding = {
        "metadata": {"name": ACCOUNT},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": ACCOUNT,
        },
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": "default"}],
    }
    t = datastore.transport
    t.request("POST", f"{RBAC}/clusterroles", body={"metadata": {"name": ACCOUNT}, "rules": rules})
    t.request("POST", f"{RBAC}/clusterrolebindings", body=binding)
    _create_account(datastore)
    try:
        yield
    finally:
        for path in (
            f"{RBAC}/clusterrolebindings/{ACCOUNT}",
            f"{RBAC}/clusterroles/{ACCOUNT}",
            f"{ACCOUNTS}/{ACCOUNT}",
        ):
            with contextlib.suppress(NotFound):
                t.request("DELETE", path)


def _pod(control_plane: ControlPlane, datastore: Datastore, tmp_path: Path) -> Mount:
    """The ServiceAccount volume kubelet would mount, with a fresh bound token."""
    ca = (control_plane.pki / "ca.crt").read_text()
    return Mount(tmp_path / "serviceaccount", token=_token(datastore), ca_pem=ca)


def _environ(control_plane: ControlPlane) -> dict[str, str]:
    port = str(control_plane.apiserver_port)
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}


@pytest.mark.usefixtures("account")
def test_in_cluster_is_the_service_account_with_its_rbac(
    control_plane: ControlPlane, datastore: Datastore, tmp_path: Path
) -> None:
    mount = _pod(control_plane, datastore, tmp_path)
    ds = Datastore.in_cluster(mount.root, _environ(control_plane))
    assert ds.transport.host == control_plane.url  # type: ignore[attr-defined]
    ds.list(IPPool)  # allowed: verified TLS against the mount's CA, token accepted
    with pytest.raises(Forbidden) as forbidden:
        ds.list_raw(kinds.NODE)
    assert forbidden.value.status == 403
    assert USER in str(forbidden.value)


@pytest.mark.usefixtures("account")
def test_rotation_is_picked_up_at_the_next_request(
    control_plane: ControlPlane, datastore: Datastore, tmp_path: Path
) -> None:
    """kubelet swaps in a new token before the old one expires: the very next request
    carries it (the apiserver reports the new token's id)."""
    mount = _pod(control_plane, datastore, tmp_path)
    ds = Datastore.in_cluster(mount.root, _environ(control_plane))
    first = (mount.root / "token").read_text()
    assert _credential(ds) == f"JTI={_jti(first)}"
    second = _token(datastore)
    mount.write(second)
    assert _credential(ds) == f"JTI={_jti(second)}"


@pytest.mark.usefixtures("account")
def test_client_recovers_after_its_token_is_revoked_and_replaced(
    control_plane: ControlPlane, datastore: Datastore, tmp_path: Path
) -> None:
    """Deleting and recreating the ServiceAccount (new uid) invalidates every token it
    had: the client is refused (401, not a crash), and works again, the same object,
    once the mount holds a token of the new account."""
    mount = _pod(control_plane, datastore, tmp_path)
    ds = Datastore.in_cluster(mount.root, _environ(control_plane))
    ds.list(IPPool)
    datastore.transport.request("DELETE", f"{ACCOUNTS}/{ACCOUNT}")
    _create_account(datastore)
    started = time.monotonic()
    deadline = started + 60  # the apiserver caches a good authentication for ~10 s
    while True:
        try:
            ds.list(IPPool)
        except Unauthorized as refused:
            assert refused.status == 401
            break
        assert time.monotonic() < deadline, "a token of the deleted account still works"
        time.sleep(0.2)
    print(f"old token refused {time.monotonic() - started:.1f}s after the account was recreated")
    mount.write(_token(datastore))  # kubelet's next rotation
    ds.list(IPPool)
    with pytest.raises(Forbidden):
        ds.list_raw(kinds.NODE)
