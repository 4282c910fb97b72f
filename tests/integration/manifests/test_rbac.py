"""What each ServiceAccount may do on a real apiserver is the documented set (issue 21 item 9).

``manifests/rbac.yaml`` is applied server-side to the session's kube-apiserver (RBAC
on), then ``kubectl auth can-i --list --as=system:serviceaccount:tabby-system:<account>``
is read, as an operator would check it, and compared with the table in
docs/deploy.md ("RBAC: what each ServiceAccount may do and why", parsed by
tests/rbac_table.py): nothing more, nothing less, so the doc and the grants cannot
drift. What Kubernetes gives every authenticated user is set apart.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.controlplane import ControlPlane
from tests.integration.manifests.test_manifests import (
    MANIFESTS,
    NAMESPACE,
    Kubectl,
    _remove_everything,
)
from tests.rbac_table import ACCOUNTS, documented_grants

pytestmark = pytest.mark.integration

# system:basic-user and system:discovery: every authenticated user's, not Tabby's.
EVERYONE = {"selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews"}


@pytest.fixture(scope="module")
def kubectl(control_plane: ControlPlane) -> Iterator[Kubectl]:
    """namespace.yaml and rbac.yaml applied; removed again after the module."""
    kubectl = Kubectl(control_plane)
    try:
        for name in ("namespace.yaml", "rbac.yaml"):
            kubectl.ok(
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=tabby-rbac-test",
                "-f",
                str(MANIFESTS / name),
            )
        yield kubectl
    finally:
        _remove_everything(kubectl)


def can_i_list(kubectl: Kubectl, account: str, namespace: str) -> set[tuple[str, str]]:
    """(verb, resource) pairs of `kubectl auth can-i --list`, without resource names."""
    out = kubectl.ok(
        "auth",
        "can-i",
        "--list",
        f"--as=system:serviceaccount:{NAMESPACE}:{account}",
        f"--namespace={namespace}",
        "--no-headers",
    )
    granted: set[tuple[str, str]] = set()
    for line in out.splitlines():
        # Resources  Non-Resource URLs  Resource Names  Verbs ; lists print as [a b]
        fields = line.replace("[", " [").split()
        if not fields or fields[0].startswith("["):
            continue  # a non-resource URL row (discovery): resources column is empty
        resource = fields[0]
        brackets = line[line.index("[") :].split("]")
        urls, names, verbs = (b.strip(" [") for b in brackets[:3])
        assert not urls and not names, f"{account}: unexpected row {line!r}"
        if resource.split(".")[0] in EVERYONE:
            continue
        granted |= {(verb, resource) for verb in verbs.split()}
    return granted


@pytest.mark.parametrize("account", ACCOUNTS)
@pytest.mark.parametrize("namespace", ["default", NAMESPACE, "kube-system"])
def test_can_i_list_is_the_documented_set(kubectl: Kubectl, account: str, namespace: str) -> None:
    granted = can_i_list(kubectl, account, namespace)
    documented = documented_grants()[account]
    assert not any("*" in verb or "*" in resource for verb, resource in granted), granted
    assert granted - documented == set(), f"{account} may do more than docs/deploy.md says"
    assert documented - granted == set(), f"docs/deploy.md lists grants {account} lacks"


def test_node_account_no_longer_patches_events(kubectl: Kubectl) -> None:
    """The narrowing of issue 21: unused verbs are gone."""
    node = can_i_list(kubectl, "tabby-node", "default")
    controllers = can_i_list(kubectl, "tabby-controllers", "default")
    assert ("patch", "events") not in node
    assert ("create", "events") in node
    assert not {r for _, r in controllers if r == "events"}
