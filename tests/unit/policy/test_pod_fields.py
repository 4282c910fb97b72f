"""A slimmed Pod means to policy exactly what the Pod means.

The agent caches every Pod through :func:`policy.pod_fields.slim_pod`; if the
slimming dropped a field a parser reads, remote pods would silently leave or join
ipsets. Random Pods, as kubelet and users write them (managed fields, volumes,
conditions, odd types included), must parse, resolve and fail the same way slimmed
and whole.
"""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from policy import PolicyError, parse_pod
from policy.membership import AddressBook, Owner, pod_facts, trusted_pod
from policy.pod_fields import slim_pod

IPS = ["10.0.0.1", "10.0.0.2", "fd00::1"]
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _odd(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a well-typed value, one time in ten junk (the parsers must still see it)."""
    return st.integers(0, 9).flatmap(lambda n: JUNK if n == 0 else value)


ports = st.fixed_dictionaries(
    {"containerPort": _odd(st.integers(0, 70000))},
    optional={
        "name": _odd(st.sampled_from(["http", "dns", "metrics", ""])),
        "protocol": _odd(st.sampled_from(["TCP", "UDP", "SCTP"])),
        "hostPort": st.integers(1, 9),
    },
)
containers = st.fixed_dictionaries(
    {"name": st.text(max_size=4)},
    optional={
        "ports": _odd(st.lists(ports, max_size=3)),
        "image": st.just("busybox"),
        "env": st.lists(st.fixed_dictionaries({"name": st.text(max_size=3)}), max_size=2),
    },
)
pods = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": st.sampled_from(["a", "b"]), "namespace": st.sampled_from(["x", "y"])},
            optional={
                "uid": _odd(st.sampled_from(["u1", "u2"])),
                "labels": _odd(
                    st.dictionaries(st.sampled_from(["app", "tier"]), st.text(max_size=3))
                ),
                "resourceVersion": st.just("7"),
                "deletionTimestamp": st.just("2026-12-06T00:00:00Z"),
                "annotations": st.dictionaries(st.text(max_size=4), st.text(max_size=4)),
                "managedFields": st.lists(JUNK, max_size=2),
            },
        ),
    },
    optional={
        "apiVersion": st.just("v1"),
        "kind": st.just("Pod"),
        "spec": _odd(
            st.fixed_dictionaries(
                {},
                optional={
                    "containers": _odd(st.lists(containers, max_size=3)),
                    "nodeName": _odd(st.sampled_from(["", "n1", "n2"])),
                    "hostNetwork": _odd(st.booleans()),
                    "volumes": st.lists(JUNK, max_size=2),
                },
            )
        ),
        "status": _odd(
            st.fixed_dictionaries(
                {},
                optional={
                    "phase": _odd(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"])),
                    "podIP": _odd(st.sampled_from(IPS)),
                    "podIPs": _odd(
                        st.lists(st.fixed_dictionaries({"ip": _odd(st.sampled_from(IPS))}))
                    ),
                    "conditions": st.lists(JUNK, max_size=2),
                },
            )
        ),
    },
)
books = st.dictionaries(
    st.sampled_from(IPS).map(ipaddress.ip_address),
    st.builds(
        Owner,
        namespace=st.sampled_from(["x", "y"]),
        pod=st.sampled_from(["a", "b"]),
        node=st.sampled_from(["", "n1"]),
        uid=st.sampled_from(["", "u1"]),
    ),
    max_size=3,
)


def _outcome(fn: Any, obj: Any) -> Any:
    try:
        return ("ok", fn(obj))
    except PolicyError as err:
        return ("error", str(err))
    except (AttributeError, TypeError, KeyError) as err:  # the whole Pod fails the same way
        return ("crash", type(err).__name__)


@given(pods, books)
def test_a_slim_pod_means_the_same_to_policy(obj: dict[str, Any], owners: dict[Any, Owner]) -> None:
    whole = copy.deepcopy(obj)
    slim = slim_pod(obj)
    assert obj == whole  # the informer's event is not changed
    book = AddressBook(owners.items())
    assert _outcome(parse_pod, slim) == _outcome(parse_pod, obj)
    assert _outcome(pod_facts, slim) == _outcome(pod_facts, obj)
    assert _outcome(lambda o: trusted_pod(o, book), slim) == _outcome(
        lambda o: trusted_pod(o, book), obj
    )


def test_a_kubelet_pod_keeps_what_policy_reads_and_nothing_else() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "shop",
            "uid": "1f0c",
            "labels": {"app": "web"},
            "resourceVersion": "812",
            "annotations": {"tabby.dev/podIP": "10.244.1.5/32"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
            "ownerReferences": [{"kind": "StatefulSet", "name": "web"}],
        },
        "spec": {
            "nodeName": "node1",
            "containers": [
                {
                    "name": "main",
                    "image": "nginx",
                    "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                    "env": [{"name": "A", "value": "b"}],
                }
            ],
            "volumes": [{"name": "token", "projected": {"sources": []}}],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.244.1.5",
            "podIPs": [{"ip": "10.244.1.5"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "main", "ready": True}],
        },
    }
    assert slim_pod(pod) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "shop",
            "uid": "1f0c",
            "labels": {"app": "web"},
            "resourceVersion": "812",
        },
        "spec": {
            "nodeName": "node1",
            "containers": [
                {
                    "name": "main",
                    "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                }
            ],
        },
        "status": {"phase": "Running", "podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}]},
    }
