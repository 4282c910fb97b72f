"""The ClusterNetworkPolicy CRD Tabby installs (issue 19): upstream's, judged by a real
kube-apiserver.

`manifests/crds/clusternetworkpolicies.yaml` is written by hack/gen-cnp-crd.sh from the
pinned sigs.k8s.io/network-policy-api module; the first test fails when it was edited
by hand or the pin moved without regenerating it. The others create policies through
the session's apiserver (which installed every CRD in manifests/crds/): valid ones are
stored and served in both versions, and invalid ones are refused by the schema's own
rules (OpenAPI bounds and enums, CEL), with a message that names the field or rule.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import DatastoreError, NotFound

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
CNP = kinds.CLUSTERNETWORKPOLICY
V1ALPHA2 = "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies"
ALL_NAMESPACES: dict[str, Any] = {"namespaces": {}}
AB = {"a": "b"}
RANGE = {"start": 80, "end": 90}


def cnp(name: str, **spec: Any) -> dict[str, Any]:
    """A ClusterNetworkPolicy body: an Admin deny of everything unless spec says more."""
    body = {"tier": "Admin", "priority": 10, "subject": ALL_NAMESPACES}
    body |= spec
    return {"apiVersion": CNP.api_version, "kind": CNP.kind, "metadata": {"name": name},
            "spec": body}  # fmt: skip


def deny_from(peer: dict[str, Any], **rule: Any) -> dict[str, Any]:
    return {"name": "r", "action": "Deny", "from": [peer], **rule}


def test_the_manifest_is_the_pinned_modules_crd() -> None:
    done = subprocess.run(
        [str(REPO / "hack/gen-cnp-crd.sh"), "--check"], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_a_valid_policy_is_stored_and_served_in_both_versions(datastore: Datastore) -> None:
    body = cnp(
        "tbt-cnp-valid",
        ingress=[
            deny_from({"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": AB}}},
                      protocols=[{"tcp": {"destinationPort": {"range": RANGE}}}]),
            {"action": "Pass", "from": [{"namespaces": {"matchLabels": {"team": "x"}}}]},
        ],
        egress=[
            {"action": "Accept", "to": [{"networks": ["10.0.0.0/8"]}, {"nodes": {}}]},
            {"action": "Accept", "to": [ALL_NAMESPACES],
             "protocols": [{"destinationNamedPort": "http"}]},
        ],
    )  # fmt: skip
    stored = datastore.create_raw(CNP, body)
    try:
        assert stored["spec"] == body["spec"]
        old = datastore.transport.request("GET", f"{V1ALPHA2}/tbt-cnp-valid")
        assert old["apiVersion"] == "policy.networking.k8s.io/v1alpha2"
        assert old["spec"] == body["spec"]
    finally:
        datastore.delete_raw(CNP, "tbt-cnp-valid")


# (what is wrong, the spec fields that make it so, a piece of the apiserver's message)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("priority above 1000", {"priority": 1001}, "spec.priority"),
    ("negative priority", {"priority": -1}, "spec.priority"),
    ("unknown tier", {"tier": "Middle"}, "spec.tier"),
    ("two subjects", {"subject": {"namespaces": {}, "pods": {"podSelector": {}}}},
     "spec.subject"),
    ("no subject", {"subject": {}}, "spec.subject"),
    ("unknown action", {"ingress": [{"action": "Allow", "from": [ALL_NAMESPACES]}]},
     "spec.ingress[0].action"),
    ("a rule without peers", {"ingress": [{"action": "Deny", "from": []}]},
     "spec.ingress[0].from"),
    ("a peer with two kinds", {"ingress": [deny_from(
        {"namespaces": {}, "pods": {"podSelector": {}}})]}, "spec.ingress[0].from[0]"),
    ("a CIDR with host bits", {"egress": [{"action": "Deny", "to": [
        {"networks": ["10.0.0.1/8"]}]}]}, "Invalid CIDR format provided"),
    ("an empty port range", {"ingress": [deny_from(ALL_NAMESPACES, protocols=[
        {"udp": {"destinationPort": {"range": {"start": 90, "end": 90}}}}])]},
     "Start port must be less than End port"),
    ("port 0", {"ingress": [deny_from(ALL_NAMESPACES, protocols=[
        {"tcp": {"destinationPort": {"number": 0}}}])]}, "spec.ingress[0].protocols[0]"),
    ("a named port towards networks", {"egress": [{"action": "Deny", "to": [
        {"networks": ["10.0.0.0/8"]}], "protocols": [{"destinationNamedPort": "http"}]}]},
     "networks/nodes/domainNames peer cannot be set with namedPorts"),
    ("26 ingress rules", {"ingress": [deny_from(ALL_NAMESPACES)] * 26}, "spec.ingress"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_an_invalid_policy_is_refused_naming_its_fault(
    datastore: Datastore, spec: dict[str, Any], message: str
) -> None:
    with contextlib.suppress(NotFound):
        datastore.delete_raw(CNP, "tbt-cnp-invalid")
    with pytest.raises(DatastoreError) as refused:
        datastore.create_raw(CNP, cnp("tbt-cnp-invalid", **spec))
    assert refused.value.status == 422, refused.value
    assert message in str(refused.value)
    with pytest.raises(NotFound):
        datastore.get_raw(CNP, "tbt-cnp-invalid")
