"""Traffic from a pod to its own node: the rendered cali-INPUT / cali-wl-to-host chains.

Issue 21 item 7: pods reached every host port of their node (BGP's 179 included).
The default is now DROP after the pod's egress policy, as Calico's
DefaultEndpointToHostAction; ACCEPT and RETURN are the configurable alternatives.
"""

from __future__ import annotations

import pytest

from felix.agent import parse_args
from felix.policy_dataplane import (
    FROM_DISPATCH,
    INPUT,
    WL_TO_HOST,
    FilterState,
    PolicyDataplane,
    parse_endpoint_to_host_action,
    render,
)
from policy import desired_state, parse_pod

CLEAR = ("-j", "MARK", "--set-xmark", "0x0/0x10000")
COMMENT = ("-m", "comment", "--comment", "configured DefaultEndpointToHostAction")
ALLOWED = ("-m", "mark", "--mark", "0x10000/0x10000")
BGP_DROP = ("-p", "tcp", "--dport", "179", "-m", "comment", "--comment", "the node's BGP port",
            "-j", "DROP")  # fmt: skip
SERVICE = (*ALLOWED, "-m", "conntrack", "--ctstate", "DNAT",
           "-m", "comment", "--comment", "a Service's endpoint on this node")  # fmt: skip


def _state(action: str) -> FilterState:
    pod = parse_pod(
        {
            "metadata": {"name": "a", "namespace": "x", "labels": {}},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"podIP": "10.244.0.1"},
        }
    )
    local = {"caliaaaa": pod}
    return render(desired_state([], [pod], [], local), local, parse_endpoint_to_host_action(action))


def _args(state: FilterState, chain: str) -> list[tuple[str, ...]]:
    return [r.args for r in state.chains[chain]]


def test_default_drops_pod_to_host_after_egress_policy() -> None:
    state = _state("DROP")
    # cali-INPUT judges only traffic from pods, and leaves by goto (RETURN goes to INPUT)
    assert _args(state, INPUT) == [("-i", "cali+", "-g", WL_TO_HOST)]
    assert _args(state, WL_TO_HOST) == [
        CLEAR,
        ("-j", FROM_DISPATCH),
        BGP_DROP,  # Tabby's own listener, whatever the action
        (*SERVICE, "-j", "ACCEPT"),  # a Service's hostNetwork endpoint, policy allowing
        (*COMMENT, "-j", "DROP"),
    ]
    assert state.hooks["INPUT"][0].args == ("-j", INPUT)


def test_drop_hands_a_services_host_endpoint_to_the_allow_action() -> None:
    """With the Return allow action the DNAT'ed connection goes back to INPUT's rules."""
    pod = parse_pod(
        {
            "metadata": {"name": "a", "namespace": "x", "labels": {}},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"podIP": "10.244.0.1"},
        }
    )
    local = {"caliaaaa": pod}
    state = render(desired_state([], [pod], [], local), local, "DROP", "RETURN")
    assert (*SERVICE, "-j", "RETURN") in _args(state, WL_TO_HOST)


@pytest.mark.parametrize("action", ["ACCEPT", "RETURN"])
def test_accept_and_return_apply_only_to_what_egress_policy_allowed(action: str) -> None:
    rules = _args(_state(action), WL_TO_HOST)
    assert rules[:3] == [CLEAR, ("-j", FROM_DISPATCH), BGP_DROP]  # never the BGP port
    assert rules[3] == (*ALLOWED, *COMMENT, "-j", action)
    assert rules[4][-2:] == ("-j", "DROP")  # no verdict from the dispatch: fail closed
    assert len(rules) == 5


def test_replies_to_the_nodes_own_connections_are_accepted_before_the_action() -> None:
    """Health checks: the pod's cali-fw chain accepts ESTABLISHED after anti-spoofing."""
    fw = _args(_state("DROP"), "cali-fw-caliaaaa")
    assert fw[0] == ("!", "-s", "10.244.0.1/32", "-j", "DROP")
    assert fw[1] == ("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")


def test_non_workload_traffic_is_never_judged() -> None:
    """Failsafe for node-to-node BGP, VXLAN, IPIP: only `-i cali+` rules in the INPUT path."""
    for action in ("DROP", "ACCEPT", "RETURN"):
        state = _state(action)
        assert all("cali+" in r.args for r in state.chains[INPUT])
        # the only port-specific rule in the pod-to-host chain drops; none accepts
        by_port = [rule for rule in _args(state, WL_TO_HOST) if "-p" in rule]
        assert by_port == [BGP_DROP]


@pytest.mark.parametrize(
    ("value", "action"),
    [("Drop", "DROP"), ("accept", "ACCEPT"), (" Return ", "RETURN"), ("DROP", "DROP")],
)
def test_action_parses_any_case(value: str, action: str) -> None:
    assert parse_endpoint_to_host_action(value) == action


def test_bad_action_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"one of Drop, Accept, Return .* not 'REJECT'"):
        parse_endpoint_to_host_action("REJECT")
    with pytest.raises(ValueError, match="not 'allow'"):
        PolicyDataplane(runner=None, backend="nft", endpoint_to_host="allow")  # type: ignore[arg-type]


def test_agent_reads_the_setting_from_its_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--node-name", "n", "--kubeconfig", "k"]
    monkeypatch.delenv("TABBY_DEFAULT_ENDPOINT_TO_HOST_ACTION", raising=False)
    assert parse_args(base).endpoint_to_host == "DROP"
    monkeypatch.setenv("TABBY_DEFAULT_ENDPOINT_TO_HOST_ACTION", "Accept")
    assert parse_args(base).endpoint_to_host == "ACCEPT"
    assert parse_args([*base, "--endpoint-to-host", "return"]).endpoint_to_host == "RETURN"
    monkeypatch.setenv("TABBY_DEFAULT_ENDPOINT_TO_HOST_ACTION", "open")
    with pytest.raises(SystemExit):
        parse_args(base)
    assert "must be one of Drop, Accept, Return" in capsys.readouterr().err
