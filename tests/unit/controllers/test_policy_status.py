"""controllers.policy_status.plan: the writes that show each policy's realization.

Plain objects in, writes out: a ClusterNetworkPolicy's Realized condition, a
NetworkPolicy's label and annotation, and nothing at all once the objects show it.
"""

from __future__ import annotations

from typing import Any

from controllers.policy_status import (
    MarkWrite,
    Plan,
    PolicyStatusController,
    ReportDelete,
    node_health_fields,
    plan,
)
from datastore import kinds
from datastore.client import Datastore
from datastore.informer import object_key
from datastore.memory import MemoryTransport
from policy.realization import REALIZED_ANNOTATION, REALIZED_LABEL, parse_node_health

NOW = "2026-12-06T21:00:00Z"
NOW_S = 1796590800.0  # NOW as a Unix time
NP_UID = "11111111-aaaa-4000-8000-000000000000"
CNP_UID = "22222222-bbbb-4000-8000-000000000000"


def node(name: str, ready: bool = True) -> dict[str, Any]:
    status = "True" if ready else "Unknown"
    return {
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": status, "reason": "x"}]},
    }


def report(
    name: str, programmed: dict[str, str], applied: list[str], at: str = NOW
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": f"rv-{name}"},
        "status": {"programmed": programmed, "applied": applied, "updatedAt": at},
    }


def networkpolicy(generation: int = 2, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "allow-db",
            "namespace": "web",
            "generation": generation,
            "uid": NP_UID,
            "resourceVersion": "7",
            **meta,
        },
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }


def cluster_policy(generation: int = 3, status: dict[str, Any] | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "apiVersion": "policy.networking.k8s.io/v1beta1",
        "kind": "ClusterNetworkPolicy",
        "metadata": {
            "name": "deny-imds",
            "generation": generation,
            "uid": CNP_UID,
            "resourceVersion": "9",
        },
        "spec": {
            "tier": "Admin",
            "priority": 10,
            "subject": {"namespaces": {}},
            "egress": [
                {
                    "action": "Deny",
                    "to": [{"networks": ["169.254.169.254/32"]}],
                }
            ],
        },
    }
    if status is not None:
        raw["status"] = status
    return raw


NP_KEY, CNP_KEY = "np/web/allow-db", "cnp/deny-imds"


def both_on(name: str, np_gen: int = 2, cnp_gen: int = 3) -> dict[str, Any]:
    return report(
        name,
        {NP_KEY: f"{np_gen}:{NP_UID[:8]}", CNP_KEY: f"{cnp_gen}:{CNP_UID[:8]}"},
        [NP_KEY, CNP_KEY],
    )


def run(
    reports: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    cluster: list[dict[str, Any]],
    nps: list[dict[str, Any]],
) -> Plan:
    return plan(reports, nodes, cluster, nps, now=NOW, now_s=NOW_S)


def test_all_nodes_realized_writes_the_condition_label_and_annotation() -> None:
    nodes = [node("a"), node("b"), node("c")]
    out = run(
        [both_on("a"), both_on("b"), both_on("c")], nodes, [cluster_policy()], [networkpolicy()]
    )
    (status,) = out.statuses
    (condition,) = status.body["status"]["conditions"]
    assert condition == {
        "type": "Realized",
        "status": "True",
        "reason": "AllNodesRealized",
        "message": "3/3 nodes run generation 3",
        "observedGeneration": 3,
        "lastTransitionTime": NOW,
    }
    assert status.body["metadata"]["resourceVersion"] == "9"  # a compare-and-swap
    assert out.marks == [MarkWrite("web", "allow-db", "3-of-3", "3/3 nodes run generation 2")]
    assert not out.deletes


def test_a_node_behind_is_named_and_counted() -> None:
    nodes = [node("a"), node("b"), node("c", ready=False)]
    reports = [both_on("a"), both_on("b", np_gen=1, cnp_gen=2)]  # c: no report
    out = run(reports, nodes, [cluster_policy()], [networkpolicy()])
    condition = out.statuses[0].body["status"]["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("False", "NodesPending")
    assert condition["message"] == "1/3 nodes run generation 3; behind: b, c"
    assert out.marks[0].label == "1-of-3"
    assert out.marks[0].message == "1/3 nodes run generation 2; behind: b, c"


def test_more_than_three_nodes_behind_are_counted_not_listed() -> None:
    nodes = [node(n) for n in "abcdef"]
    out = run([], nodes, [], [networkpolicy()])
    assert out.marks[0].message == "0/6 nodes run generation 2; behind: a, b, c (+3 more)"


def test_nothing_is_written_once_the_objects_show_it() -> None:
    nodes = [node("a"), node("b")]
    reports = [both_on("a"), both_on("b")]
    first = run(reports, nodes, [cluster_policy()], [networkpolicy()])
    shown_cnp = first.statuses[0].body
    mark = first.marks[0]
    shown_np = networkpolicy(
        labels={REALIZED_LABEL: mark.label}, annotations={REALIZED_ANNOTATION: mark.message}
    )
    again = run(reports, nodes, [shown_cnp], [shown_np])
    assert len(again) == 0


def test_a_new_generation_is_written_and_the_transition_time_kept_while_status_holds() -> None:
    nodes = [node("a")]
    shown = run([both_on("a")], nodes, [cluster_policy()], []).statuses[0].body
    shown["status"]["conditions"][0]["lastTransitionTime"] = "2026-12-06T20:00:00Z"
    newer = {**shown, "metadata": {**shown["metadata"], "generation": 4}}
    # Generation 4 is programmed too: still True, only the message and generation move.
    out = run([both_on("a", cnp_gen=4)], nodes, [newer], [])
    condition = out.statuses[0].body["status"]["conditions"][0]
    assert condition["message"] == "1/1 nodes run generation 4"
    assert condition["observedGeneration"] == 4
    assert condition["lastTransitionTime"] == "2026-12-06T20:00:00Z"
    # Not yet programmed: False, and the transition is now.
    out = run([both_on("a")], nodes, [newer], [])
    condition = out.statuses[0].body["status"]["conditions"][0]
    assert (condition["status"], condition["lastTransitionTime"]) == ("False", NOW)


def test_other_implementations_conditions_are_kept() -> None:
    theirs = {"type": "Accepted", "status": "True", "reason": "Ok", "message": "",
              "lastTransitionTime": NOW, "observedGeneration": 3}  # fmt: skip
    raw = cluster_policy(status={"conditions": [theirs]})
    out = run([both_on("a")], [node("a")], [raw], [])
    conditions = out.statuses[0].body["status"]["conditions"]
    assert conditions[0] == theirs and conditions[1]["type"] == "Realized"


def test_an_invalid_policy_says_so_instead_of_pending_forever() -> None:
    bad_np = networkpolicy()
    bad_np["spec"] = {"podSelector": {"matchLabels": {"app": 5}}}
    bad_cnp = cluster_policy()
    bad_cnp["spec"]["tier"] = "Middle"
    out = run([both_on("a")], [node("a")], [bad_cnp], [bad_np])
    condition = out.statuses[0].body["status"]["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("False", "Invalid")
    assert condition["message"].startswith("not programmed by any node: ")
    assert out.marks[0].label == "invalid"
    assert out.marks[0].message.startswith("not programmed by any node: ")


def test_a_policy_selecting_no_pod_is_realized_on_zero_nodes() -> None:
    programmed_only = report("a", {NP_KEY: f"2:{NP_UID[:8]}"}, [])
    out = run([programmed_only], [node("a")], [], [networkpolicy()])
    assert out.marks[0].label == "0-of-0"
    assert "selects no pod yet; every node runs generation 2" in out.marks[0].message


def test_a_gone_nodes_report_is_deleted_once_old_and_a_malformed_one_skipped() -> None:
    old = report("gone", {}, [], at="2026-12-06T20:50:00Z")  # 10 min before NOW
    fresh = report("joining", {}, [], at="2026-12-06T20:59:00Z")  # its Node not seen yet
    broken = {"metadata": {"name": "bad"}, "status": {"programmed": ["not", "a", "map"]}}
    out = run([old, fresh, broken, both_on("a")], [node("a")], [], [])
    assert out.deletes == [ReportDelete("gone", "rv-gone")]
    assert len(out.skipped_reports) == 1 and "bad" in out.skipped_reports[0]


def test_a_pass_writes_at_most_its_budget_and_the_next_passes_go_on() -> None:
    """A node back after many changes means many writes: a pass makes at most
    ``writes_per_pass`` of them, and the following passes finish the rest."""
    ds = Datastore(MemoryTransport())
    for i in range(12):
        body = networkpolicy()
        body["metadata"] = {"name": f"np-{i}", "namespace": "web", "generation": 1}
        ds.create_raw(kinds.NETWORKPOLICY, body)
    controller = PolicyStatusController(ds, writes_per_pass=5)

    def refresh_caches() -> None:  # what the informers would deliver
        for role, kind in (("networkpolicies", kinds.NETWORKPOLICY), ("nodes", kinds.NODE)):
            cache = controller.informers[role].cache
            cache.clear()
            for item in ds.list_raw(kind)[0]:
                cache[object_key(item)] = item

    ds.create_raw(kinds.NODE, node("a"))
    refresh_caches()
    done = []
    for _ in range(4):
        result = controller.run_pass()
        done.append((result.written, result.deferred))
        refresh_caches()
    assert done == [(5, 7), (5, 2), (2, 0), (0, 0)]
    labels = {
        np["metadata"]["labels"][REALIZED_LABEL] for np in ds.list_raw(kinds.NETWORKPOLICY)[0]
    }
    assert labels == {"0-of-1"}  # node a has published no report


def test_a_slimmed_node_keeps_what_realization_reads() -> None:
    whole = node("a", ready=False)
    whole["status"] |= {"images": [{"names": ["x"], "sizeBytes": 1}], "addresses": []}
    whole["metadata"] |= {"labels": {"k": "v"}, "managedFields": [{}]}
    slim = node_health_fields(whole)
    assert slim == {
        "metadata": {"name": "a"},
        "status": {"conditions": whole["status"]["conditions"]},
    }
    assert parse_node_health(slim) == parse_node_health(whole)
