"""Tabby's filter rules beside kube-proxy's: the allow action and where the verdict sits.

Issue 22: a pod's connect to a Service without endpoints timed out, because
cali-FORWARD (first in FORWARD) ACCEPTed it before kube-proxy's REJECT in
KUBE-SERVICES. Now cali-FORWARD only drops or marks; the ACCEPT of marked packets is
appended to FORWARD (default ``Accept``) or left out (``Return``: the kernel chain's
later rules and policy decide). These tests walk a packet through the rendered rules
with kube-proxy's iptables-mode jumps between Tabby's, as on a real node.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from felix.agent import parse_args
from felix.dataplane.iptables import Rule
from felix.policy_dataplane import (
    FORWARD,
    WL_TO_HOST,
    FilterState,
    PolicyDataplane,
    parse_filter_allow_action,
    render,
)
from policy import desired_state, parse_pod, parse_policy
from policy.model import NetworkPolicy
from tests.unit.dataplane.fake_kernel import FakeKernel

CLIENT_IP, SERVER_IP, EMPTY_SVC, OUTSIDE = "10.244.0.1", "10.244.0.2", "10.96.0.10", "1.1.1.1"
CLIENT_IF, SERVER_IF = "caliclient", "caliserver"

# kube-proxy (iptables mode) in the filter table: its jumps, and the REJECT of a
# Service without endpoints, as `iptables-save` shows them on a lab node.
KUBE_JUMPS = (
    Rule(("-m", "conntrack", "--ctstate", "NEW", "-j", "KUBE-SERVICES")),
    Rule(("-m", "conntrack", "--ctstate", "NEW", "-j", "KUBE-EXTERNAL-SERVICES")),
)
KUBE_CHAINS = {
    "KUBE-SERVICES": (
        Rule(("-d", f"{EMPTY_SVC}/32", "-p", "tcp", "-m", "tcp", "--dport", "80", "-j", "REJECT")),
    ),
    "KUBE-EXTERNAL-SERVICES": (),
}


@dataclass
class Packet:
    src: str
    dst: str
    dport: int
    in_if: str
    out_if: str
    ctstate: str = "NEW"
    mark: int = 0


class Walker:
    """The filter FORWARD chain of one node: Tabby's rules, then kube-proxy's, then policy."""

    def __init__(self, state: FilterState, policy: str = "DROP") -> None:
        forward = (*state.hooks["FORWARD"], *KUBE_JUMPS, *state.appended.get("FORWARD", ()))
        self.chains: Mapping[str, tuple[Rule, ...]] = {
            **state.chains,
            **KUBE_CHAINS,
            "FORWARD": forward,
        }
        self.policy = policy

    def forward(self, pkt: Packet) -> str:
        verdict = self.run("FORWARD", pkt)
        return self.policy if verdict == "RETURN" else verdict

    def run(self, chain: str, pkt: Packet, depth: int = 0) -> str:
        """ACCEPT, DROP, REJECT, or RETURN (explicit or off the end)."""
        assert depth < 10, "jump loop"
        for rule in self.chains[chain]:
            match, kind, target = _split(rule.args)
            if not self.matches(match, pkt):
                continue
            if target in ("ACCEPT", "DROP", "REJECT", "RETURN"):
                return target
            if target == "MARK":
                value, mask = (int(x, 16) for x in match_target_args(rule.args)[1].split("/"))
                pkt.mark = (pkt.mark & ~mask) ^ value
                continue
            verdict = self.run(target, pkt, depth + 1)
            if kind == "-g" or verdict != "RETURN":
                return verdict  # a goto's RETURN leaves the calling chain too
        return "RETURN"

    def matches(self, match: tuple[str, ...], pkt: Packet) -> bool:
        i, negate = 0, False
        while i < len(match):
            tok = match[i]
            if tok == "!":
                negate, i = True, i + 1
                continue
            if tok == "-m":
                i += 2
                continue
            arg = match[i + 1]
            held = self._term(tok, arg, pkt)
            if held == negate:
                return False
            negate, i = False, i + 2
        return True

    @staticmethod
    def _term(tok: str, arg: str, pkt: Packet) -> bool:
        if tok in ("-i", "-o"):
            iface = pkt.in_if if tok == "-i" else pkt.out_if
            return iface.startswith(arg[:-1]) if arg.endswith("+") else iface == arg
        if tok in ("-s", "-d"):
            addr = pkt.src if tok == "-s" else pkt.dst
            return ipaddress.ip_address(addr) in ipaddress.ip_network(arg)
        if tok == "--mark":
            value, mask = (int(x, 16) for x in arg.split("/"))
            return pkt.mark & mask == value
        if tok == "--ctstate":
            return pkt.ctstate in arg.split(",")
        if tok == "-p":
            return True  # every packet here is TCP
        if tok == "--dport":
            return pkt.dport == int(arg)
        assert tok == "--comment", f"walker does not understand {tok}"
        return True


def _split(args: tuple[str, ...]) -> tuple[tuple[str, ...], str, str]:
    """(matches, -j or -g, target) of a rule."""
    for i, tok in enumerate(args):
        if tok in ("-j", "-g"):
            return args[:i], tok, args[i + 1]
    raise AssertionError(f"no target in {args}")


def match_target_args(args: tuple[str, ...]) -> tuple[str, ...]:
    return args[args.index("-j") + 2 :]


def _pod(name: str, ip: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "x", "labels": {"app": name}},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"podIP": ip},
    }


def _egress_port_80() -> NetworkPolicy:
    return parse_policy(
        {
            "metadata": {"name": "client-egress", "namespace": "x"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "client"}},
                "policyTypes": ["Egress"],
                "egress": [{"ports": [{"protocol": "TCP", "port": 80}]}],
            },
        }
    )


def _deny_server_ingress() -> NetworkPolicy:
    return parse_policy(
        {
            "metadata": {"name": "server-deny", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"app": "server"}}},
        }
    )


def _state(policies: list[NetworkPolicy], allow: str = "ACCEPT") -> FilterState:
    client, server = parse_pod(_pod("client", CLIENT_IP)), parse_pod(_pod("server", SERVER_IP))
    local = {CLIENT_IF: client, SERVER_IF: server}
    action = parse_filter_allow_action(allow)
    desired = desired_state(policies, [client, server], [], local, allow=action)
    return render(desired, local, "DROP", action)


def _to_empty_service(dport: int = 80) -> Packet:
    return Packet(CLIENT_IP, EMPTY_SVC, dport, CLIENT_IF, "eth0")


def _to_server(dport: int = 8080, ctstate: str = "NEW") -> Packet:
    return Packet(CLIENT_IP, SERVER_IP, dport, CLIENT_IF, SERVER_IF, ctstate)


@pytest.mark.parametrize("allow", ["ACCEPT", "RETURN"])
@pytest.mark.parametrize("policies", [[], [_egress_port_80()]], ids=["no-policy", "egress-80"])
def test_kube_proxys_reject_is_reached_for_what_policy_allows(
    allow: str, policies: list[NetworkPolicy]
) -> None:
    walker = Walker(_state(policies, allow))
    assert walker.forward(_to_empty_service()) == "REJECT"


@pytest.mark.parametrize("allow", ["ACCEPT", "RETURN"])
def test_policy_denies_still_drop_before_kube_proxy(allow: str) -> None:
    walker = Walker(_state([_egress_port_80(), _deny_server_ingress()], allow), policy="ACCEPT")
    # egress allows only port 80: the Service's port 81 is dropped, not rejected
    assert walker.forward(_to_empty_service(81)) == "DROP"
    # the server's ingress denies everything, even with FORWARD's policy ACCEPT
    assert walker.forward(_to_server(80)) == "DROP"


def test_accept_decides_at_the_bottom_of_forward_whatever_its_policy() -> None:
    state = _state([])
    assert Walker(state, policy="DROP").forward(_to_server()) == "ACCEPT"
    outside = Packet(CLIENT_IP, OUTSIDE, 443, CLIENT_IF, "eth0")
    assert Walker(state, policy="DROP").forward(outside) == "ACCEPT"
    assert Walker(state, policy="DROP").forward(_to_server(ctstate="ESTABLISHED")) == "ACCEPT"
    # cali-FORWARD itself never accepts: kube-proxy's rules after it always run
    assert all(r.args[-1] != "ACCEPT" for r in state.chains[FORWARD])
    [verdict] = state.appended["FORWARD"]
    assert verdict.args[:4] == ("-m", "mark", "--mark", "0x10000/0x10000")
    assert verdict.args[-2:] == ("-j", "ACCEPT")


def test_a_packet_no_pod_sent_or_receives_is_not_judged() -> None:
    state = _state([])
    transit = Packet("192.168.1.5", "192.168.2.5", 22, "eth0", "eth1", mark=0x10000)
    assert Walker(state, policy="DROP").forward(transit) == "DROP"  # a foreign mark is cleared
    assert Walker(state, policy="ACCEPT").forward(transit) == "ACCEPT"


def test_return_leaves_the_verdict_to_the_kernel_chain() -> None:
    state = _state([], "RETURN")
    assert state.appended == {}
    assert Walker(state, policy="ACCEPT").forward(_to_server()) == "ACCEPT"
    assert Walker(state, policy="DROP").forward(_to_server()) == "DROP"
    established = _to_server(ctstate="ESTABLISHED")
    assert Walker(state, policy="DROP").forward(established) == "DROP"
    conntrack = [r.args for r in state.chains[f"cali-fw-{CLIENT_IF}"] if "--ctstate" in r.args]
    assert ("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN") in conntrack
    assert all(r.args[-1] != "ACCEPT" for rules in state.chains.values() for r in rules)


def test_return_lets_replies_to_the_node_back_to_input() -> None:
    rules = [r.args for r in _state([], "RETURN").chains[WL_TO_HOST]]
    reply = ("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN")
    assert rules.index(reply) == 2  # after the egress dispatch, before the DROP
    assert rules[-1][-2:] == ("-j", "DROP")
    assert reply not in [r.args for r in _state([]).chains[WL_TO_HOST]]


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_kernel_forward_order_tabby_kube_proxy_tabby(backend: str) -> None:
    """Applied to a node that already has kube-proxy's jumps: Tabby's jump above them,
    its verdict below; a second apply writes nothing."""
    kernel = FakeKernel()
    filter_table = kernel.iptables[backend]["filter"]
    filter_table["KUBE-SERVICES"] = []
    filter_table["FORWARD"] = ["-m conntrack --ctstate NEW -j KUBE-SERVICES"]
    dataplane = PolicyDataplane(kernel, backend)
    client = parse_pod(_pod("client", CLIENT_IP))
    dataplane.apply([], [client], [], {CLIENT_IF: client})
    forward = kernel.rules(backend, "filter", "FORWARD")
    assert forward[0] == "-j cali-FORWARD"
    assert forward[1] == "-m conntrack --ctstate NEW -j KUBE-SERVICES"
    assert forward[2].endswith("-j ACCEPT") and "0x10000/0x10000" in forward[2]
    writes = len(kernel.restore_inputs)
    dataplane.apply([], [client], [], {CLIENT_IF: client})
    assert len(kernel.restore_inputs) == writes
    # switching to Return removes the appended verdict and keeps kube-proxy's rule
    PolicyDataplane(kernel, backend, allow="Return").apply([], [client], [], {CLIENT_IF: client})
    assert kernel.rules(backend, "filter", "FORWARD") == forward[:2]


def test_setting_parses_like_calicos_and_rejects_the_rest() -> None:
    assert parse_filter_allow_action("Accept") == "ACCEPT"
    assert parse_filter_allow_action(" return ") == "RETURN"
    with pytest.raises(ValueError, match=r"one of Accept, Return .* not 'DROP'"):
        parse_filter_allow_action("DROP")


def test_agent_reads_the_setting_from_flag_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = ["--node-name", "n", "--kubeconfig", "k"]
    monkeypatch.delenv("TABBY_IPTABLES_FILTER_ALLOW_ACTION", raising=False)
    assert parse_args(base).filter_allow == "ACCEPT"
    monkeypatch.setenv("TABBY_IPTABLES_FILTER_ALLOW_ACTION", "Return")
    assert parse_args(base).filter_allow == "RETURN"
    assert parse_args([*base, "--filter-allow-action", "accept"]).filter_allow == "ACCEPT"
    with pytest.raises(SystemExit):
        parse_args([*base, "--filter-allow-action", "Reject"])
