"""`make conformance`: the upstream network suites, run against real-node labs.

The judge of a NetworkPolicy implementation is upstream's suites, not our own tests:
the Kubernetes e2e `Netpol` specs of the pinned release (hack/build-e2e.sh builds a
thin binary of the sig-network specs) and cyclonus's generated cases, probed by pod IP
and by Service IP. Services must keep working beside the CNI: the e2e
`[sig-network] Services` and sig-network `[Conformance]` specs run once with Tabby and
once, in the same harness on the same lab shape, with Debian's ptp + host-local (the
peer); Tabby must pass every spec the peer passes. This module brings up a 3-node lab
(kubelet, containerd, kube-proxy, Tabby from manifests/), runs the suites, brings up
the peer's lab for its Services run, and writes docs/conformance.md plus the JUnit and
JSON reports under build/conformance/.

The network-policy-api conformance suite (hack/go/npapi-conformance) judges
ClusterNetworkPolicy: its ClusterNetworkPolicy profile with the NamedPorts and
EgressNodePeers features, and the suite's own YAML report.

`--policy kube-network-policies` runs the same suites with Tabby's policy engine off
and sig-network's reference implementation enforcing instead: when both give the same
pass list, no result can be blamed on the harness.

Parsing and rendering are pure functions (tested in tests/unit/test_conformance.py);
the subprocess and file I/O stay in the `run_*` functions and `main`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lab.kubecluster import KubeSpec

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "build" / "conformance"
DEFAULT_REPORT = REPO / "docs" / "conformance.md"
LABS_DIR = Path("/run/tabby-labs")  # default home of the labs; what is in it is ours
LAB_NODES = 3  # each lab's real nodes (the e2e suite is told the count)
E2E_FOCUS = "Netpol"
# The specs that open SCTP sockets (servers and `agnhost connect --protocol=sctp`). Not
# plain "SCTP": two TCP specs only name SCTP in a policy, and must run everywhere.
SCTP_SPECS = r"\[Feature:SCTPConnectivity\]"
# cyclonus: its default generated cases, minus SCTP when the kernel lacks it; the
# other excludes are cyclonus's own default exclude list.
CYCLONUS_DEFAULT_EXCLUDES = (
    "multi-peer",
    "upstream-e2e",
    "example",
    "end-port",
    "namespaces-by-default-label",
)
CYCLONUS_MODES = ("pod-ip", "service-ip")
# Cases a probe mode cannot judge, by cyclonus tag, with why. cyclonus v0.5.6 looks up
# each pod's Service IP once, at setup: a pod it creates during a case gets none
# (Resources.CreatePod) and one it relabels loses it (Pod.SetLabels), so a service-ip
# probe of that pod dials ":80", the probing pod's own listener, and counts a connection
# that never left the pod (seen here as a policy "allowing" every port). These cases run
# in pod-ip mode.
_NO_SERVICE_IP = (
    "cyclonus v0.5.6 gives a pod it creates or relabels during a case no Service IP, so "
    "service-ip probes of it dial the prober's own port (runs in pod-ip mode)"
)
CYCLONUS_MODE_EXCLUDES: dict[str, dict[str, str]] = {
    "service-ip": {
        "create-pod": _NO_SERVICE_IP,
        "create-namespace": _NO_SERVICE_IP,
        "set-pod-labels": _NO_SERVICE_IP,
    },
}
POLICIES = ("tabby", "kube-network-policies")
SUITES = ("all", "e2e", "cyclonus", "services", "cnp")
# The network-policy-api conformance suite (hack/go/npapi-conformance): the
# ClusterNetworkPolicy profile with every experimental feature Tabby implements.
NPAPI_SUITE = "network-policy-api ClusterNetworkPolicy"
NPAPI_PROFILE = "ClusterNetworkPolicy"
NPAPI_FEATURES = ("ClusterNetworkPolicyNamedPorts", "ClusterNetworkPolicyEgressNodePeers")
# The suite's base manifests without SCTP servers (agnhost porter exits when it cannot
# open an SCTP socket, and the base pods would never be Ready); built by build-e2e.sh.
NPAPI_NO_SCTP_BASE = "base/manifests-no-sctp.yaml"
NPAPI_REPORT = "npapi-report.yaml"
NPAPI_NAMESPACE_PREFIX = "network-policy-conformance-"  # the base manifests' namespaces
# Why `--policy kube-network-policies` runs no ClusterNetworkPolicy suite.
KNP_NO_CNP = (
    "kube-network-policies v0.8.0 (the newest release on the module proxy) implements the "
    "v1alpha1 AdminNetworkPolicy API, not ClusterNetworkPolicy v1beta1, so it cannot "
    "validate this harness; the suite runs with --policy tabby only"
)
# v0.3.0's tests about SCTP alone (their ShortNames): reported skipped without SCTP.
NPAPI_SCTP_TESTS = (
    "CNPAdminTierEgressSCTP",
    "CNPAdminTierIngressSCTP",
    "CNPBaselineTierEgressSCTP",
    "CNPBaselineTierIngressSCTP",
)
# The Services comparison: upstream's Service specs and every sig-network conformance
# spec (EndpointSlices, proxy, HostPort, Networking Granular Checks, ...).
SERVICES_FOCUS = r"\[sig-network\] Services |\[sig-network\].*\[Conformance\]"
# What the lab cannot offer either CNI: skipped (with why), not run to fail.
SERVICES_SKIPS = {
    r"\[sig-network\] DNS ": "the DNS specs' queriers run dig: alpine's bind-tools in "
    "agnhost and the e2e-test-images/jessie-dnsutils image, neither built here (the lab's "
    "CoreDNS serves the Services specs' lookups)",
    r"\[sig-network\] Proxy ": "kube-apiserver proxies to pod IPs; the lab's control plane "
    "is not a node of the pod network and has no route to pods",
    r"Services should create endpoints for unready pods": "reads each pod's answer "
    "through kube-apiserver's pod proxy, which needs a route from the control plane to pod "
    "IPs (as the Proxy specs); it waits 15 min before failing on either CNI",
    r"LoadBalancer": "needs a load balancer; the lab has no cloud provider",
    r"\[Disruptive\]": "restarts kube-proxy or kube-apiserver on a node over SSH; the lab's "
    "nodes run no SSH server",
}
# The peer of the Services comparison: KubeSpec(cni=...), Debian's reference plugins.
PEER_CNI = "ptp"
PEER_LABEL = "ptp + host-local"

Progress = Callable[[str], None]


# -- results -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CaseResult:
    """One spec or generated case: passed | failed | skipped, with why when not passed."""

    suite: str
    name: str
    state: str
    seconds: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class PolicyChange:
    """A policy created, updated or deleted in a spec, and what the probes after it saw.

    `wrong_probes` counts probe attempts that disagreed with the expected matrix (the
    suite retries each pair every 1 s for up to 10 s); `last_wrong_s` is how long after
    the change the last of them ran, `first_probe_s` when probing began."""

    spec: str
    policy: str
    first_probe_s: float | None
    wrong_probes: int = 0
    last_wrong_s: float | None = None
    # Of the wrong probes, how many connected where the policy denies (a deny not yet
    # in place); the rest were refused where it allows.
    passed_denied: int = 0

    @property
    def enforced_by_first_probe(self) -> bool:
        return self.wrong_probes == 0


@dataclass
class SuiteRun:
    """What one invocation of a suite produced."""

    suite: str
    command: list[str]
    seconds: float
    exit_code: int
    cases: list[CaseResult] = field(default_factory=list)
    changes: list[PolicyChange] = field(default_factory=list)
    error: str = ""
    notes: list[str] = field(default_factory=list)
    report: str = ""  # a report the suite writes itself (network-policy-api's YAML)
    output: str = field(default="", repr=False)  # what the suite printed (go test -v)

    def count(self, state: str) -> int:
        return sum(1 for c in self.cases if c.state == state)


# -- the kernel -----------------------------------------------------------------------------
def sctp_unavailable_reason() -> str | None:
    """None when this kernel opens SCTP sockets, else why the SCTP specs must be skipped.

    Only a socket is opened (and closed): nothing is configured."""
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP)
    except OSError as exc:
        return (
            "this kernel has no SCTP sockets: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) "
            f"failed with {exc.strerror or exc} (the servers and probes of these specs open one)"
        )
    sock.close()
    return None


def go_quote_meta(text: str) -> str:
    """Go's regexp.QuoteMeta: ginkgo's --focus is RE2, where Python's re.escape output
    (an escaped space, say) is an invalid escape."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


# -- go test output (the network-policy-api suite) ---------------------------------------------
_GO_RESULT = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)\s*$")
_GO_RUN = re.compile(r"^=== (?:RUN|CONT|NAME)\s+(\S+)\s*$")
_GO_STATES = {"PASS": "passed", "FAIL": "failed", "SKIP": "skipped"}
_SCTP_NOT_RUN = "SCTP probe not run (NPAPI_SCTP_PROBES=skip)"  # sctp-probes.patch's log
# testify's failure fields worth a report cell, in the order they are looked for.
_TESTIFY_FIELDS = ("Error:", "Messages:")


def parse_go_test_verbose(
    text: str, suite: str, root: str, sctp_reason: str | None = None
) -> list[CaseResult]:
    """Every leaf (sub)test under *root* from ``go test -v`` output, with its state and,
    for a failure, the first testify ``Error:``/``Messages:`` lines logged under it.

    Only leaves are counted: a test with subtests passes or fails through them. Names
    are shown without *root*'s prefix and with Go's ``_`` turned back into spaces. With
    *sctp_reason* (the kernel has no SCTP sockets), a failure whose only failed probes
    were SCTP ones gets the state ``kernel`` and that reason."""
    results: dict[str, tuple[str, float]] = {}
    logs: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        run = _GO_RUN.match(line)
        if run:
            current = run.group(1)
            continue
        result = _GO_RESULT.match(line)
        if result:
            state, name, seconds = result.groups()
            results[name] = (_GO_STATES[state], float(seconds))
            continue
        if current:
            logs.setdefault(current, []).append(line.strip())
    prefix = root + "/"
    names = [n for n in results if n.startswith(prefix)]
    leaves = [n for n in names if not any(o.startswith(n + "/") for o in names)]
    cases = []
    for name in sorted(leaves):
        state, seconds = results[name]
        reason = _failure_reason(logs.get(name, [])) if state == "failed" else ""
        if state == "failed" and sctp_reason and _sctp_only(logs.get(name, [])):
            state, reason = "kernel", f"only SCTP probes failed: {sctp_reason}"
        if state == "skipped":
            reason = _skip_message(logs.get(name, []))
        elif state == "passed" and (left := _count(logs.get(name, []), _SCTP_NOT_RUN)):
            reason = f"{left} SCTP probes not run"
        elif state == "passed" and _listed_skip(logs.get(name, [])):
            # upstream's SkipTests: the test returns at once, which go test calls a pass
            state = "skipped"
            reason = f"kernel: {sctp_reason}" if sctp_reason else "listed in -skip-tests"
        shown = name[len(prefix) :].replace("_", " ")
        cases.append(CaseResult(suite, shown, state, seconds, reason))
    return cases


def _failure_reason(log_lines: list[str]) -> str:
    found = []
    for i, line in enumerate(log_lines):
        for key in _TESTIFY_FIELDS:
            if line.startswith(key):
                following = log_lines[i + 1] if i + 1 < len(log_lines) else ""
                text = line[len(key) :].strip()
                if following and not following.endswith(":") and ":" not in following[:16]:
                    text += " " + following
                found.append(f"{key} {text}".strip())
    return _first_line(" / ".join(found[:2]) or "failed (no testify message logged)", 300)


def _count(log_lines: list[str], text: str) -> int:
    return sum(1 for line in log_lines if text in line)


def _listed_skip(log_lines: list[str]) -> bool:
    """The suite's own ``Skipping <ShortName>`` log line of a test in -skip-tests."""
    return any(re.match(r"^suite\.go:\d+: Skipping \w+$", line) for line in log_lines)


def _skip_message(log_lines: list[str]) -> str:
    """go test -v logs a t.Skip's message as ``file.go:NN: message``."""
    for line in log_lines:
        if re.match(r"^\S+\.go:\d+: ", line):
            return _first_line(line.split(": ", 1)[1])
    return "skipped by the suite (no message)"


_FAILED_COMMAND = re.compile(r"FAILED Command was \[(.*)\]")


def _sctp_only(log_lines: list[str]) -> bool:
    """Every probe that failed under this subtest was an SCTP one."""
    commands = [m.group(1) for line in log_lines if (m := _FAILED_COMMAND.search(line))]
    return bool(commands) and all("--protocol=sctp" in c for c in commands)


# -- the e2e Netpol suite (ginkgo JSON report) -------------------------------------------------
_KLOG = re.compile(r"^\s*I(\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})\s+\d+ \S+\] (.*)$")
_CHANGE = re.compile(r"^(creating|updating|deleting) network policy (\S+)")
_WRONG = re.compile(r"^\s*probe #\d+ :: connectivity (not )?expected ::")
_PROBE = re.compile(r"^Starting probe from pod ")


def _klog_seconds(match: re.Match[str]) -> float:
    """Seconds since the start of the year from a klog header (the month and day are
    enough to order one run's lines, across midnight too)."""
    month, day, hour, minute, second, micro = (int(g) for g in match.groups()[:6])
    return (
        ((_DAYS_BEFORE_MONTH[month - 1] + day) * 24 + hour) * 3600
        + minute * 60
        + second
        + micro / 1e6
    )


_DAYS_BEFORE_MONTH = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)


def policy_changes(spec: str, output: str) -> list[PolicyChange]:
    """Each policy change in a spec's captured output and what the probes after it saw.

    A change is `creating|updating|deleting network policy NS/NAME` (kubemanager.go); the
    probes that follow, up to the next change, are its validation; a change with no probe
    after it is left out."""
    changes: list[PolicyChange] = []
    current: dict[str, Any] | None = None

    def close() -> None:
        # A change no probe followed (a spec's cleanup) says nothing about enforcement.
        if current is not None and current["first_probe_s"] is not None:
            changes.append(PolicyChange(spec=spec, **current))

    start = 0.0
    for line in output.splitlines():
        match = _KLOG.match(line)
        if not match:
            continue
        now, message = _klog_seconds(match), match.group(7)
        change = _CHANGE.match(message)
        if change:
            close()
            start = now
            current = {"policy": f"{change.group(1)} {change.group(2)}", "first_probe_s": None}
        elif current is not None and _PROBE.match(message) and current["first_probe_s"] is None:
            current["first_probe_s"] = round(now - start, 3)
        elif current is not None and (wrong := _WRONG.match(message)):
            current["wrong_probes"] = current.get("wrong_probes", 0) + 1
            if wrong.group(1):  # "connectivity not expected": it connected
                current["passed_denied"] = current.get("passed_denied", 0) + 1
            current["last_wrong_s"] = round(now - start, 3)
    close()
    return changes


def _spec_name(spec: dict[str, Any]) -> str:
    texts = [*(spec.get("ContainerHierarchyTexts") or []), spec.get("LeafNodeText", "")]
    return " ".join(t for t in texts if t)


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def parse_ginkgo_report(
    report: list[dict[str, Any]],
    skip_reasons: dict[str, str] | None = None,
    focus: str | None = None,
) -> tuple[list[CaseResult], list[PolicyChange]]:
    """The `It` specs of a ginkgo JSON report, and the policy changes their output shows.

    `skip_reasons` maps a regex over spec names to the reason a skip pattern was passed
    (e.g. SCTP: the kernel's); a spec skipped at run time keeps the suite's own message.
    The report lists every spec of the binary; with `focus`, those outside it (skipped
    without a message) are left out, as ginkgo never selected them."""
    cases: list[CaseResult] = []
    changes: list[PolicyChange] = []
    for suite in report:
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            name = _spec_name(spec)
            state = str(spec.get("State", "unknown"))
            reason = ""
            if state == "skipped":
                message = (spec.get("Failure") or {}).get("Message", "")
                if not message and focus and not re.search(focus, name):
                    continue  # never selected: outside the focus
                reason = _first_line(message) or _skip_reason(name, skip_reasons or {})
            elif state != "passed":
                reason = _first_line((spec.get("Failure") or {}).get("Message", ""))
                state = "failed"
            seconds = float(spec.get("RunTime", 0)) / 1e9
            cases.append(CaseResult("e2e", name, state, round(seconds, 1), reason))
            changes += policy_changes(name, spec.get("CapturedGinkgoWriterOutput", ""))
    cases.sort(key=lambda c: c.name)
    return cases, changes


def _skip_reason(name: str, skip_reasons: dict[str, str]) -> str:
    for pattern, reason in skip_reasons.items():
        if re.search(pattern, name):
            return reason
    return "skipped by the suite (no message)"


# -- cyclonus (JUnit) ----------------------------------------------------------------------
def parse_cyclonus_junit(xml_text: str, suite: str) -> list[CaseResult]:
    """cyclonus's JUnit file: one testcase per generated case, a <failure> if it failed
    (cyclonus records no time per case)."""
    root = ET.fromstring(xml_text)
    cases = []
    for case in root.iter("testcase"):
        failed = case.find("failure") is not None
        reason = "the probed matrix differed from cyclonus's expected one" if failed else ""
        state = "failed" if failed else "passed"
        cases.append(CaseResult(suite, case.get("name", "?"), state, 0.0, reason))
    return cases


# -- enforcement time -------------------------------------------------------------------
@dataclass(frozen=True)
class EnforcementSummary:
    changes: int
    enforced_by_first_probe: int
    first_probe_median_ms: float | None
    retried: int
    last_wrong_max_s: float | None
    wrong_probes: int
    passed_denied: int


def summarize_enforcement(changes: Sequence[PolicyChange]) -> EnforcementSummary:
    """How soon after each policy change the suite's probes saw it enforced."""
    first = [c.first_probe_s for c in changes if c.first_probe_s is not None]
    retried = [c for c in changes if not c.enforced_by_first_probe]
    last_wrong = [c.last_wrong_s for c in retried if c.last_wrong_s is not None]
    return EnforcementSummary(
        changes=len(changes),
        enforced_by_first_probe=len(changes) - len(retried),
        first_probe_median_ms=round(statistics.median(first) * 1000, 1) if first else None,
        retried=len(retried),
        last_wrong_max_s=max(last_wrong) if last_wrong else None,
        wrong_probes=sum(c.wrong_probes for c in changes),
        passed_denied=sum(c.passed_denied for c in changes),
    )


# -- Services: Tabby against the peer -------------------------------------------------------
@dataclass(frozen=True)
class PassListComparison:
    """Two runs of the same specs, on the same lab shape, with two CNIs."""

    ours: str
    peer: str
    only_peer: list[str]  # passed with the peer, not with Tabby: must be empty
    only_ours: list[str]  # passed with Tabby, not with the peer
    failed_both: list[CaseResult]  # Tabby's failure, for a spec the peer fails too
    both_passed: int

    @property
    def ours_contains_peer(self) -> bool:
        return not self.only_peer


def compare_pass_lists(ours: SuiteRun, peer: SuiteRun) -> PassListComparison:
    passed = {c.name for c in ours.cases if c.state == "passed"}
    peer_passed = {c.name for c in peer.cases if c.state == "passed"}
    peer_failed = {c.name for c in peer.cases if c.state == "failed"}
    return PassListComparison(
        ours=ours.suite,
        peer=peer.suite,
        only_peer=sorted(peer_passed - passed),
        only_ours=sorted(passed - peer_passed),
        failed_both=sorted(
            (c for c in ours.cases if c.state == "failed" and c.name in peer_failed),
            key=lambda c: c.name,
        ),
        both_passed=len(passed & peer_passed),
    )


def services_comparison(runs: Sequence[SuiteRun]) -> PassListComparison | None:
    """Tabby's Services run against the peer's, when both completed."""
    by_name = {r.suite: r for r in runs if not r.error}
    ours = by_name.get(services_suite("tabby", {}).name)
    peer = by_name.get(services_suite(PEER_CNI, {}).name)
    return compare_pass_lists(ours, peer) if ours and peer else None


def run_succeeded(runs: Sequence[SuiteRun]) -> bool:
    """The exit status's verdict: the policy suites fail nothing Tabby is to blame for; the Services
    runs completed and Tabby passes every spec the peer passes (a spec the lab breaks
    for both CNIs is reported, not held against Tabby)."""
    if not runs or any(r.error for r in runs):
        return False
    services = [r for r in runs if r.suite.startswith("e2e Services")]
    others = [r for r in runs if r not in services]
    # A suite with failures the kernel explains (no SCTP sockets) exits non-zero.
    if any((r.exit_code != 0 and not r.count("kernel")) or r.count("failed") for r in others):
        return False
    if not services:
        return True
    comparison = services_comparison(runs)
    return comparison is not None and comparison.ours_contains_peer


# -- the report ------------------------------------------------------------------------
@dataclass
class ConformanceRun:
    """Everything docs/conformance.md says about one `make conformance`."""

    policy: str
    commit: str
    started: datetime
    seconds: float
    lab_seconds: float
    versions: dict[str, str]
    skips: dict[str, str]
    runs: list[SuiteRun]
    command: str


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# The tools behind each suite a run can hold (by the start of its name), as
# hack/build-e2e.sh records their versions in VERSIONS.
TOOLS_OF_SUITE = {
    "e2e": ("ginkgo", "kubernetes-e2e"),
    "cyclonus": ("cyclonus",),
    "network-policy-api": ("network-policy-api",),
}


def versions_used(versions: Mapping[str, str], runs: Iterable[SuiteRun]) -> list[tuple[str, str]]:
    """The (tool, version) pairs of the suites that ran, sorted: a report names only
    what produced its results."""
    tools = {
        tool
        for run in runs
        for prefix, names in TOOLS_OF_SUITE.items()
        if run.suite.startswith(prefix)
        for tool in names
    }
    return sorted((k, v) for k, v in versions.items() if k in tools)


def render_markdown(run: ConformanceRun) -> str:
    """docs/conformance.md: the totals, then every spec and case with its state."""
    lines = [
        "# Upstream conformance: NetworkPolicy and Services",
        "",
        "Written by `make conformance` (lab/conformance.py); do not edit by hand.",
        "",
        f"- Date: {run.started:%Y-%m-%d %H:%M} UTC; commit `{run.commit}`",
        f"- Policy enforced by: **{run.policy}**",
        f"- Total time: {run.seconds / 60:.1f} min (labs brought up in {run.lab_seconds:.0f} s)",
        "- Cluster: 3 real-node lab nodes (kubelet, containerd, kube-proxy iptables), "
        "Tabby installed from manifests/",
        "- Suites: " + ", ".join(f"{k} {v}" for k, v in versions_used(run.versions, run.runs)),
        f"- Command: `{run.command}`",
        "",
    ]
    if run.skips:
        lines += ["Skipped by this machine's kernel, not by choice:", ""]
        lines += [f"- `{pattern}`: {reason}" for pattern, reason in run.skips.items()]
        lines.append("")
    lines += _totals_table(run.runs)
    lines += _comparison_section(services_comparison(run.runs))
    lines += _enforcement_section(run.runs)
    for suite_run in run.runs:
        lines += _suite_section(suite_run)
    return "\n".join(lines) + "\n"


def _totals_table(runs: Iterable[SuiteRun]) -> list[str]:
    lines = [
        "## Totals",
        "",
        "| Suite | Passed | Failed | Skipped | Time | Exit |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    kernel = False
    for r in runs:
        failed = str(r.count("failed"))
        if r.count("kernel"):
            failed += f" (+{r.count('kernel')} kernel)"
            kernel = True
        lines.append(
            f"| {r.suite} | {r.count('passed')} | {failed} | {r.count('skipped')} "
            f"| {r.seconds / 60:.1f} min | {r.exit_code} |"
        )
    if kernel:
        lines += [
            "",
            '"kernel": subtests whose only failed probes are SCTP probes, which this '
            "machine's kernel cannot open (the suite stops a subtest at its first failed "
            "probe, so its later probes did not run).",
        ]
    return [*lines, ""]


def _comparison_section(c: PassListComparison | None) -> list[str]:
    if c is None:
        return []
    verdict = "yes" if c.ours_contains_peer else "**no**"
    lines = [
        f"## Services: Tabby against {PEER_LABEL}",
        "",
        f"The same specs, in the same harness, on the same lab shape; the peer's lab runs "
        f"Debian's {PEER_LABEL} (with portmap, as Tabby's conflist has) and static routes "
        "between nodes. Tabby must pass every spec the peer passes.",
        "",
        f"- Tabby's pass list contains the peer's: {verdict}",
        f"- Passed with both: {c.both_passed}",
        f"- Passed with {c.peer.split('(')[-1].rstrip(')')} only: {len(c.only_peer)}",
        *(f"  - {name}" for name in c.only_peer),
        f"- Passed with Tabby only: {len(c.only_ours)}",
        *(f"  - {name}" for name in c.only_ours),
        f"- Failed with both (the lab's limits, not the CNI's): {len(c.failed_both)}",
        *(f"  - {case.name}: {case.reason}" for case in c.failed_both),
    ]
    return [*lines, ""]


def _enforcement_section(runs: Iterable[SuiteRun]) -> list[str]:
    changes = [c for r in runs for c in r.changes]
    if not changes:
        return []
    s = summarize_enforcement(changes)
    first = f"{s.first_probe_median_ms} ms" if s.first_probe_median_ms is not None else "n/a"
    lines = [
        "## Policy to enforcement, as the e2e probes saw it",
        "",
        "Each policy create, update or delete in the e2e specs is followed by a probe of "
        "every pod pair; a probe that disagrees with the expected matrix is retried every "
        "1 s for up to 10 s.",
        "",
        f"- Policy changes: {s.changes}",
        f"- Enforced on every node by the first probe attempt: {s.enforced_by_first_probe} "
        f"(the suite starts that probe's exec a median {first} after the change; its "
        "connection follows once the exec is set up)",
        f"- Needed a retry: {s.retried} ({s.wrong_probes} wrong probe attempts in all: "
        f"{s.passed_denied} connected before a deny was in place, "
        f"{s.wrong_probes - s.passed_denied} refused before an allow was)",
    ]
    if s.last_wrong_max_s is not None:
        lines.append(f"- Latest wrong probe: {s.last_wrong_max_s:.1f} s after its change")
        worst = sorted(changes, key=lambda c: c.last_wrong_s or 0.0, reverse=True)[:5]
        lines += ["", "| Spec | Change | Wrong probes | Last wrong |", "|---|---|---:|---:|"]
        lines += [
            f"| {_md_cell(c.spec)} | {c.policy} | {c.wrong_probes} | {c.last_wrong_s:.1f} s |"
            for c in worst
            if c.wrong_probes
        ]
    return [*lines, ""]


def _suite_section(run: SuiteRun) -> list[str]:
    lines = [f"## {run.suite}", "", f"`{' '.join(run.command)}`", ""]
    lines += [*(f"- {note}" for note in run.notes), *([""] if run.notes else [])]
    if run.error:
        lines += [f"**Did not complete:** {run.error}", ""]
    if run.report:
        lines += ["The suite's own report:", "", "```yaml", run.report.rstrip(), "```", ""]
    lines += ["| State | Case | Time | Reason |", "|---|---|---:|---|"]
    order = {"failed": 0, "kernel": 1, "skipped": 2, "passed": 3}
    for c in sorted(run.cases, key=lambda c: (order.get(c.state, 0), c.name)):
        seconds = f"{c.seconds:.0f} s" if c.seconds else ""
        lines.append(f"| {c.state} | {_md_cell(c.name)} | {seconds} | {_md_cell(c.reason)} |")
    return [*lines, ""]


def summary_line(runs: Sequence[SuiteRun], seconds: float) -> str:
    """The one line a run ends with: `conformance suite=... passed=... failed=...`."""
    parts = [f"conformance total_min={seconds / 60:.1f}"]
    for r in runs:
        key = re.sub(r"[^\w-]+", "_", r.suite).strip("_")
        parts.append(f"{key}_passed={r.count('passed')} {key}_failed={r.count('failed')}")
    return " ".join(parts)


# -- running the suites (I/O) -----------------------------------------------------------------
def e2e_bin_dir() -> Path:
    """hack/build-e2e.sh builds what is missing and prints where the binaries are."""
    out = subprocess.run(
        [str(REPO / "hack" / "build-e2e.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class E2ESuite:
    """One ginkgo run of e2e-network.test: its name in the report, the stem of its
    report files, the specs it focuses on and those it skips (regex → why)."""

    name: str
    stem: str
    focus: str
    skips: dict[str, str]


def netpol_suite(skips: dict[str, str], focus: str = E2E_FOCUS) -> E2ESuite:
    return E2ESuite("e2e Netpol", "e2e-netpol", focus, skips)


def services_suite(cni: str, kernel_skips: dict[str, str]) -> E2ESuite:
    """The Services specs on a lab whose CNI is *cni* (tabby or the peer)."""
    return E2ESuite(
        f"e2e Services ({cni})",
        f"e2e-services-{cni}",
        SERVICES_FOCUS,
        {**SERVICES_SKIPS, **kernel_skips},
    )


def run_e2e(
    bin_dir: Path,
    kubeconfig: Path,
    out: Path,
    suite: E2ESuite,
    procs: int,
    nodes: int = LAB_NODES,
) -> SuiteRun:
    """A focus of the e2e sig-network binary through the ginkgo CLI (`procs` parallel
    processes; `[Serial]` specs run after the others, alone). The specs that shell out
    to kubectl get the pinned one, not whatever `kubectl` the host's PATH has.

    ``--num-nodes`` is given: without it only the first ginkgo process counts the
    nodes, and a spec that needs two (``externalTrafficPolicy=Local for type=NodePort``)
    skipped itself on the others ("Requires at least 2 nodes (not -1)")."""
    from lab.controlplane import k8s_bin_dir

    report = out / f"{suite.stem}.json"
    report.unlink(missing_ok=True)
    command = [
        str(bin_dir / "ginkgo"), "run", f"--procs={procs}", f"--focus={suite.focus}",
        *(f"--skip={pattern}" for pattern in suite.skips),
        "--timeout=3h", "--no-color", "--poll-progress-after=5m",
        f"--output-dir={out}", f"--json-report={report.name}",
        f"--junit-report=junit-{suite.stem}.xml",
        str(bin_dir / "e2e-network.test"), "--",
        f"--kubeconfig={kubeconfig}", f"--kubectl-path={k8s_bin_dir() / 'kubectl'}",
        "--provider=local", f"--num-nodes={nodes}",
        "--dump-logs-on-failure=false", "--disable-log-dump=true",
    ]  # fmt: skip
    env = {**os.environ, "KUBERNETES_CONFORMANCE_TEST": "y"}
    began = time.monotonic()
    log_path = out / f"{suite.stem}.log"
    with log_path.open("w") as log:
        code = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False
        ).returncode
    run = SuiteRun(suite.name, _display(command), time.monotonic() - began, code)
    if not report.exists():
        run.error = f"no JSON report (exit {code}); see {log_path}"
        return run
    run.cases, run.changes = parse_ginkgo_report(
        json.loads(report.read_text()), suite.skips, suite.focus
    )
    return run


def cyclonus_excludes(mode: str, exclude_sctp: bool) -> list[str]:
    """cyclonus's own default excludes, SCTP where the kernel has none, and the tags
    this probe mode cannot judge (CYCLONUS_MODE_EXCLUDES)."""
    sctp = ["sctp"] if exclude_sctp else []
    return [*sctp, *CYCLONUS_DEFAULT_EXCLUDES, *CYCLONUS_MODE_EXCLUDES.get(mode, {})]


def run_cyclonus(
    bin_dir: Path, kubeconfig: Path, out: Path, mode: str, exclude_sctp: bool
) -> SuiteRun:
    """cyclonus's generated cases, probing pod IPs or Service cluster IPs.

    `--ignore-loopback`: a pod's traffic to its own IP never leaves its network namespace,
    so no CNI can filter it; the e2e suite ignores those cells too (kubernetes#95879)."""
    junit = out / f"junit-cyclonus-{mode}.xml"
    junit.unlink(missing_ok=True)
    protocols = "TCP,UDP" if exclude_sctp else "TCP,UDP,SCTP"
    excludes = ",".join(cyclonus_excludes(mode, exclude_sctp))
    command = [
        str(bin_dir / "cyclonus"), "generate", f"--server-protocol={protocols}",
        f"--exclude={excludes}", f"--destination-type={mode}", "--ignore-loopback",
        "--job-timeout-seconds=3", "--cleanup-namespaces", f"--junit-results-file={junit}",
    ]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    began = time.monotonic()
    with (out / f"cyclonus-{mode}.log").open("w") as log:
        code = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False
        ).returncode
    run = SuiteRun(f"cyclonus {mode}", _display(command), time.monotonic() - began, code)
    run.notes = [
        f"Cases tagged `{tag}` left out: {why}"
        for tag, why in CYCLONUS_MODE_EXCLUDES.get(mode, {}).items()
    ]
    if not junit.exists():
        run.error = f"no JUnit file (exit {code}); see {out / f'cyclonus-{mode}.log'}"
        return run
    run.cases = parse_cyclonus_junit(junit.read_text(), run.suite)
    return run


def npapi_binary(bin_dir: Path) -> Path:
    """The network-policy-api suite hack/build-e2e.sh built last (named by the module's
    version and the hash of hack/go/npapi-conformance)."""
    found = list(bin_dir.glob("npapi-conformance-*.test"))
    if not found:
        raise FileNotFoundError(f"no npapi-conformance-*.test in {bin_dir}: run hack/build-e2e.sh")
    return max(found, key=lambda p: p.stat().st_mtime)  # an older source's build may remain


NPAPI_ROOT = "TestConformanceProfiles"


def npapi_command(binary: Path, report: Path, commit: str, sctp_reason: str | None) -> list[str]:
    """The suite's command: the ClusterNetworkPolicy profile with NamedPorts and
    EgressNodePeers; without SCTP sockets the SCTP tests are reported skipped and the
    base pods run no SCTP server."""
    command = [
        str(binary), f"-test.run=^{NPAPI_ROOT}$", "-test.v", "-test.timeout=2h",
        f"-conformance-profiles={NPAPI_PROFILE}",
        f"-supported-features={','.join(NPAPI_FEATURES)}",
        "-organization=tabby", "-project=tabby", "-url=https://github.com/tabby-cni/tabby",
        f"-version={commit}", "-contact=tabby maintainers",
        "-additional-info=make conformance CONFORMANCE_ARGS=\"--suite cnp\" (lab/conformance.py)",
        f"-report-output={report}",
    ]  # fmt: skip
    if sctp_reason:
        command += [
            f"-base-manifests={NPAPI_NO_SCTP_BASE}",
            f"-skip-tests={','.join(NPAPI_SCTP_TESTS)}",
        ]
    return command


NPAPI_SCTP_FREE_SUITE = f"{NPAPI_SUITE}, SCTP probes not run"


def run_npapi(
    bin_dir: Path, kubeconfig: Path, out: Path, commit: str, sctp_reason: str | None
) -> list[SuiteRun]:
    """The network-policy-api conformance profile against the lab, as upstream wrote it.

    Where the kernel has no SCTP sockets, the subtests that failed only on SCTP probes
    stopped there (the suite ends a subtest at its first failed probe): their parent
    tests run once more with NPAPI_SCTP_PROBES=skip, which logs each SCTP probe instead
    of running it, so that their TCP and UDP probes are judged too (a second run, no
    upstream report)."""
    binary = npapi_binary(bin_dir)
    report = out / NPAPI_REPORT
    report.unlink(missing_ok=True)
    command = npapi_command(binary, report, commit, sctp_reason)
    run = _run_go_suite(NPAPI_SUITE, command, out / "npapi-conformance.log", kubeconfig, out)
    run.cases = parse_go_test_verbose(run.output, run.suite, NPAPI_ROOT, sctp_reason)
    if sctp_reason:
        run.notes.append(
            f"SCTP: {sctp_reason}. The SCTP tests ({', '.join(NPAPI_SCTP_TESTS)}) are "
            f"reported skipped, the base pods run no SCTP server ({NPAPI_NO_SCTP_BASE}), "
            "and a subtest whose only failing probes are SCTP probes is counted as the "
            "kernel's (state `kernel`), not Tabby's; the next section runs those tests "
            "again with their SCTP probes left out"
        )
    if report.exists():
        run.report = report.read_text()
    elif not run.cases:
        run.error = f"no report and no results (exit {run.exit_code}); see {out}"
    parents = sorted({c.name.split("/")[0] for c in run.cases if c.state == "kernel"})
    if not parents:
        return [run]
    _wait_namespaces_gone(kubeconfig, NPAPI_NAMESPACE_PREFIX)  # the first run's cleanup
    again = [*npapi_command(binary, report, commit, sctp_reason)]
    again = [a for a in again if not a.startswith(("-report-output=", "-test.run="))]
    again.insert(1, f"-test.run={npapi_run_pattern(parents)}")
    sctp_free = _run_go_suite(
        NPAPI_SCTP_FREE_SUITE, again, out / "npapi-conformance-sctp-free.log", kubeconfig, out,
        {"NPAPI_SCTP_PROBES": "skip"},
    )  # fmt: skip
    sctp_free.cases = parse_go_test_verbose(sctp_free.output, sctp_free.suite, NPAPI_ROOT)
    if not sctp_free.cases:
        log_path = out / "npapi-conformance-sctp-free.log"
        sctp_free.error = f"no results (exit {sctp_free.exit_code}); see {log_path}"
    sctp_free.notes.append(
        "The tests above with subtests in state `kernel`, run again with "
        "`NPAPI_SCTP_PROBES=skip` (hack/go/npapi-conformance/sctp-probes.patch): each SCTP "
        "probe is logged, not run; every TCP and UDP probe runs as upstream wrote it. The "
        "reason column counts the SCTP probes left out"
    )
    return [run, sctp_free]


def _wait_namespaces_gone(kubeconfig: Path, prefix: str, timeout_s: float = 300.0) -> None:
    """Until no namespace named ``prefix...`` exists: the suite deletes its namespaces as
    it ends, and a second run creating them while they terminate is refused."""
    from datastore import kinds
    from datastore.client import Datastore

    ds = Datastore.from_kubeconfig(str(kubeconfig))
    deadline = time.monotonic() + timeout_s
    while any(n.startswith(prefix) for n in ds.list_names(kinds.NAMESPACE)):
        if time.monotonic() > deadline:
            return  # the next run reports the refusal itself
        time.sleep(1.0)


def npapi_run_pattern(parents: Sequence[str]) -> str:
    """go test's -test.run for these tests of the suite (every subtest of each)."""
    alternatives = "|".join(re.escape(p) for p in parents)
    return f"^{NPAPI_ROOT}$/^({alternatives})$"


def _run_go_suite(
    name: str,
    command: list[str],
    log_path: Path,
    kubeconfig: Path,
    cwd: Path,
    extra_env: dict[str, str] | None = None,
) -> SuiteRun:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), **(extra_env or {})}
    began = time.monotonic()
    with log_path.open("w") as log:  # streamed: `tail -f` shows the run's progress
        code = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False, cwd=cwd
        ).returncode
    run = SuiteRun(name, _display(command), time.monotonic() - began, code)
    run.output = log_path.read_text()
    return run


def _display(command: Sequence[str]) -> list[str]:
    """The command as docs/conformance.md shows it: binaries by name, not cache path."""
    home = str(Path.home())
    return [
        Path(a).name if a.startswith("/") and "/bin/" in a else a.replace(home, "~")
        for a in command
    ]


def _commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() or "unknown"


def _versions(bin_dir: Path) -> dict[str, str]:
    text = (bin_dir / "VERSIONS").read_text() if (bin_dir / "VERSIONS").exists() else ""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k: v for k, v in pairs}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the upstream NetworkPolicy and Services suites against fresh real-node labs."""
    parser = argparse.ArgumentParser(prog="python -m lab.conformance", description=main.__doc__)
    parser.add_argument("--policy", choices=POLICIES, default="tabby",
                        help="who enforces NetworkPolicy (default: tabby)")  # fmt: skip
    parser.add_argument(
        "--suite",
        default="all",
        help="comma-separated: e2e: the Netpol specs; services: the Services specs with "
        f"Tabby, then with {PEER_LABEL} (policy tabby only); cnp: the network-policy-api "
        "ClusterNetworkPolicy profile (policy tabby only); cyclonus; all (default): each",
    )
    parser.add_argument("--focus", default=E2E_FOCUS, help="e2e spec regex (default: Netpol)")
    parser.add_argument("--procs", type=int, default=3, help="parallel ginkgo processes")
    parser.add_argument(
        "--cyclonus-modes",
        default=",".join(CYCLONUS_MODES),
        help="cyclonus destinations, comma-separated (default: pod-ip,service-ip; each "
        "takes about 60 min on 2 cores)",
    )
    parser.add_argument(
        "--out", type=Path, help="JUnit/JSON/log dir (default: build/conformance/<policy>)"
    )
    parser.add_argument("--report", type=Path, help="markdown summary (default: "
                        "docs/conformance.md, or docs/conformance-<policy>.md)")  # fmt: skip
    parser.add_argument(
        "--workdir",
        type=Path,
        help="the lab's (default: /run/tabby-labs/conformance-<policy>); deleted after "
        "the run unless --keep-lab, if it is the default or the run created it",
    )
    parser.add_argument("--keep-lab", action="store_true", help="leave the lab up afterwards")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the lab creates network namespaces: run it as root")
    if args.procs < 1:
        parser.error("--procs must be at least 1")
    explicit = "all" not in args.suite.split(",")  # all: each suite the policy can run
    try:
        args.suite = parse_suites(args.suite)
    except ValueError as err:
        parser.error(str(err))
    if explicit and "services" in args.suite and args.policy != "tabby":
        parser.error("--suite services compares Tabby with its peer CNI: use --policy tabby")
    if explicit and "cnp" in args.suite and args.policy != "tabby":
        parser.error(f"--suite cnp: {KNP_NO_CNP}")
    args.cyclonus_modes = [m for m in args.cyclonus_modes.split(",") if m]
    unknown = sorted(set(args.cyclonus_modes) - set(CYCLONUS_MODES))
    if unknown or not args.cyclonus_modes:
        parser.error(f"--cyclonus-modes takes {', '.join(CYCLONUS_MODES)}; got {unknown or 'none'}")
    args.invocation = _invocation(argv if argv is not None else sys.argv[1:])
    # Per policy, so that both can run at once.
    args.out = args.out or DEFAULT_OUT / args.policy
    args.workdir = args.workdir or LABS_DIR / f"conformance-{args.policy}"
    report = args.report or (
        DEFAULT_REPORT if args.policy == "tabby" else DEFAULT_REPORT.with_name(
            f"conformance-{args.policy}.md")
    )  # fmt: skip
    return _run(args, report)


def parse_suites(value: str) -> frozenset[str]:
    """`--suite e2e,cyclonus` runs both on one lab; `all` is every suite."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SUITES))
    if unknown or not names:
        raise ValueError(f"--suite takes a comma-separated list of {', '.join(SUITES)}; "
                         f"got {', '.join(unknown) or 'none'}")  # fmt: skip
    if "all" in names:
        return frozenset(SUITES) - {"all"}
    return frozenset(names)


# What to run on a lab: (progress line, how to run it against that lab's kubeconfig).
PlanStep = tuple[str, Callable[[Path], SuiteRun | list[SuiteRun]]]
Plan = list[PlanStep]


class _Session:
    """One `make conformance`: the labs it brings up in turn, the runs they gave, and
    the report rewritten after every suite (a run cut short still leaves what it found)."""

    def __init__(self, args: argparse.Namespace, report: Path) -> None:
        self.args, self.report = args, report
        self.began, self.started = time.monotonic(), datetime.now(UTC)
        self.runs: list[SuiteRun] = []
        self.lab_seconds = 0.0
        # The code under test is the tree at the start: the report written during the
        # run, and edits made meanwhile, must not turn it into "-dirty" or a later commit.
        self.commit = _commit()
        self.bin_dir = Path()
        self.skips: dict[str, str] = {}

    def progress(self, message: str) -> None:
        print(f"[{time.monotonic() - self.began:6.0f}s] {message}", flush=True)

    def write_report(self) -> None:
        doc = ConformanceRun(
            self.args.policy, self.commit, self.started, time.monotonic() - self.began,
            self.lab_seconds, _versions(self.bin_dir), self.skips, self.runs,
            self.args.invocation,
        )  # fmt: skip
        self.report.write_text(render_markdown(doc))

    def run_on_lab(self, spec: KubeSpec, workdir: Path, plan: Plan) -> None:
        """Bring up a fresh 3-node lab of *spec*, run *plan* on it, tear it down."""
        from lab.kubecluster import KubeCluster

        ours = not workdir.exists() or workdir.parent == LABS_DIR  # safe to delete after
        _remove_stale_lab(workdir, self.progress)
        what = f"policy: {spec.policy}" if spec.cni == "tabby" else f"CNI: {PEER_LABEL}"
        self.progress(f"bringing up a 3-node real-node lab in {workdir} ({what})")
        began = time.monotonic()
        cluster = KubeCluster.up(workdir, spec, self.progress)
        self.lab_seconds += time.monotonic() - began
        try:
            for name, run_suite in plan:
                self.progress(name)
                result = run_suite(cluster.kubeconfig)
                for run in result if isinstance(result, list) else [result]:
                    self.runs.append(run)
                    self.progress(_run_line(run))
                self.write_report()
        finally:
            if not self.args.keep_lab:
                self.progress("tearing the lab down")
                cluster.down()
                if ours:
                    self.progress(remove_lab_dir(workdir, _read_mountinfo()))


def _run(args: argparse.Namespace, report: Path) -> int:
    from lab.kubecluster import KubeSpec

    session = _Session(args, report)
    args.out.mkdir(parents=True, exist_ok=True)
    session.progress("building the suites (hack/build-e2e.sh)")
    session.bin_dir = bin_dir = e2e_bin_dir()
    sctp = sctp_unavailable_reason()
    session.skips = skips = {SCTP_SPECS: sctp} if sctp else {}
    if sctp:
        session.progress(f"skipping the SCTP specs and cases: {sctp}")
    labs = [
        (KubeSpec(nodes=LAB_NODES, policy=args.policy), args.workdir, _suites(args, bin_dir, skips))
    ]
    if _runs_services(args):
        peer_plan = [_services_plan(args, bin_dir, PEER_CNI, skips)]
        peer_dir = args.workdir.with_name(f"conformance-{PEER_CNI}")
        labs.append((KubeSpec(nodes=LAB_NODES, cni=PEER_CNI), peer_dir, peer_plan))
    for spec, workdir, plan in labs:
        if plan:
            session.run_on_lab(spec, workdir, plan)
    session.write_report()
    session.progress(f"wrote {report} and {args.out}/")
    print(summary_line(session.runs, time.monotonic() - session.began))
    return 0 if run_succeeded(session.runs) else 1


def _runs_services(args: argparse.Namespace) -> bool:
    return "services" in args.suite and args.policy == "tabby"


def _services_plan(
    args: argparse.Namespace, bin_dir: Path, cni: str, skips: dict[str, str]
) -> PlanStep:
    suite = services_suite(cni, skips)
    line = f"{suite.name}: {args.procs} ginkgo processes"
    return line, lambda kubeconfig: run_e2e(bin_dir, kubeconfig, args.out, suite, args.procs)


def _suites(args: argparse.Namespace, bin_dir: Path, skips: dict[str, str]) -> Plan:
    """What this invocation runs on the policy's lab, in order."""
    plan: Plan = []
    if "e2e" in args.suite:
        suite = netpol_suite(skips, args.focus)
        plan.append(
            (
                f"e2e {args.focus}: {args.procs} ginkgo processes",
                lambda kubeconfig: run_e2e(bin_dir, kubeconfig, args.out, suite, args.procs),
            )
        )
    if _runs_services(args):  # before cyclonus: minutes, not an hour, to its first finding
        plan.append(_services_plan(args, bin_dir, "tabby", skips))
    if "cnp" in args.suite and args.policy == "tabby":
        plan.append(
            (
                f"{NPAPI_SUITE} conformance profile",
                partial(_npapi, bin_dir, args.out, _commit(), skips),
            )
        )
    if "cyclonus" in args.suite:
        for mode in args.cyclonus_modes:
            plan.append(
                (
                    f"cyclonus generate, destination {mode}",
                    partial(_cyclonus, bin_dir, args.out, mode, bool(skips)),
                )
            )
    return plan


def _cyclonus(
    bin_dir: Path, out: Path, mode: str, exclude_sctp: bool, kubeconfig: Path
) -> SuiteRun:
    return run_cyclonus(bin_dir, kubeconfig, out, mode, exclude_sctp)


def _npapi(
    bin_dir: Path, out: Path, commit: str, skips: dict[str, str], kubeconfig: Path
) -> list[SuiteRun]:
    return run_npapi(bin_dir, kubeconfig, out, commit, skips.get(SCTP_SPECS))


def _remove_stale_lab(workdir: Path, progress: Progress) -> None:
    """A lab an earlier run left in the work dir (killed, or --keep-lab)."""
    from lab.kubecluster import KubeCluster

    if not (workdir / "cluster.json").exists():
        return
    progress(f"removing the lab left in {workdir}")
    try:
        KubeCluster.load(workdir).down()
    except (OSError, ValueError, KeyError) as exc:  # its state is gone: nothing to stop
        progress(f"  (its state was incomplete: {exc})")
    for name in ("cluster.json", "cluster.json.lock"):
        (workdir / name).unlink(missing_ok=True)


def _read_mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


def mounts_under(directory: Path, mountinfo: str) -> list[str]:
    """Mount points at or below ``directory`` (mountinfo's fifth field, octal escapes
    as the kernel writes them)."""
    top = str(directory.resolve())
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if point == top or point.startswith(top + "/"):
            found.append(point)
    return found


def remove_lab_dir(workdir: Path, mountinfo: str) -> str:
    """Delete a torn-down lab's work dir (its node roots and images: about 2.5 GB on
    /run, which is memory); kept if anything is still mounted below it, because
    deleting through a bind mount would delete what it shows. Returns what was done."""
    if not workdir.exists():
        return f"{workdir} is already gone"
    mounted = mounts_under(workdir, mountinfo)
    if mounted:
        return f"kept {workdir}: still mounted below it: {', '.join(mounted[:3])}"
    shutil.rmtree(workdir)
    return f"removed {workdir}"


def _invocation(argv: Sequence[str]) -> str:
    """How this run was asked for, as `make conformance` would be typed."""
    policy, rest, args = "tabby", [], list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--policy" and args:
            policy = args.pop(0)
        elif arg.startswith("--policy="):
            policy = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    line = "make conformance" + ("" if policy == "tabby" else f" POLICY={policy}")
    return line + (f' CONFORMANCE_ARGS="{" ".join(rest)}"' if rest else "")


def _run_line(run: SuiteRun) -> str:
    kernel = f" (+{run.count('kernel')} kernel)" if run.count("kernel") else ""
    line = (
        f"{run.suite}: {run.count('passed')} passed, {run.count('failed')} failed{kernel}, "
        f"{run.count('skipped')} skipped in {run.seconds / 60:.1f} min"
    )
    return line + (f" ({run.error})" if run.error else "")


if __name__ == "__main__":
    sys.exit(main())
