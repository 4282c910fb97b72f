"""lab.conformance's pure parts: the suites' reports in, docs/conformance.md out."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from lab.conformance import (
    NPAPI_NO_SCTP_BASE,
    NPAPI_ROOT,
    NPAPI_SCTP_TESTS,
    PEER_CNI,
    SERVICES_SKIPS,
    CaseResult,
    ConformanceRun,
    PolicyChange,
    SuiteRun,
    _invocation,
    compare_pass_lists,
    cyclonus_excludes,
    go_quote_meta,
    mounts_under,
    npapi_command,
    npapi_run_pattern,
    parse_cyclonus_junit,
    parse_ginkgo_report,
    parse_go_test_verbose,
    parse_suites,
    policy_changes,
    remove_lab_dir,
    render_markdown,
    run_succeeded,
    services_suite,
    summarize_enforcement,
    summary_line,
    versions_used,
)

SPEC_OUTPUT = """\
  I1204 20:53:03.309711    6528 test_helper.go:48] Network Policy creating x/deny-all
  I1204 20:53:03.309772    6528 kubemanager.go:295] creating network policy x/deny-all
  I1204 20:53:03.312993    6528 kubemanager.go:159] Starting probe from pod a to 10.96.166.64
  I1204 20:53:03.313370    6528 kubemanager.go:159] Starting probe from pod a to 10.96.233.216
  I1204 20:53:13.073372    6528 test_helper.go:134] VALIDATION SUCCESSFUL
  I1204 20:53:14.000000    6528 kubemanager.go:306] updating network policy x/deny-all
  I1204 20:53:14.100000    6528 kubemanager.go:159] Starting probe from pod a to 10.96.166.64
  I1204 20:53:14.200000 1 k.go:215]  probe #1 :: connectivity not expected :: x/a -> 10.96.1.6
  I1204 20:53:15.300000 1 k.go:215]  probe #2 :: connectivity not expected :: x/a -> 10.96.1.6
  I1204 20:53:16.000000    6528 kubemanager.go:159] Starting probe from pod b to 10.96.166.64
  I1204 20:53:20.000000    6528 kubemanager.go:283] deleting network policy x/deny-all
"""


def test_policy_changes_split_the_output_at_each_probed_change() -> None:
    # The cleanup's delete is followed by no probe: it says nothing about enforcement.
    created, updated = policy_changes("spec", SPEC_OUTPUT)
    assert created.policy == "creating x/deny-all"
    assert created.first_probe_s == 0.003
    assert created.enforced_by_first_probe and created.last_wrong_s is None
    assert updated.policy == "updating x/deny-all"
    assert updated.wrong_probes == 2 and updated.passed_denied == 2
    assert updated.last_wrong_s == 1.3
    assert not updated.enforced_by_first_probe


def test_policy_changes_order_lines_across_midnight() -> None:
    output = (
        "I0301 23:59:59.500000 1 kubemanager.go:295] creating network policy x/p\n"
        "I0302 00:00:00.000000 1 kubemanager.go:159] Starting probe from pod a to 1.2.3.4\n"
    )
    (change,) = policy_changes("spec", output)
    assert change.first_probe_s == 0.5


def _spec(leaf: str, state: str, output: str = "", message: str = "") -> dict[str, object]:
    return {
        "LeafNodeType": "It",
        "ContainerHierarchyTexts": [
            "[sig-network] Netpol",
            "NetworkPolicy between server and client",
        ],
        "LeafNodeText": leaf,
        "State": state,
        "RunTime": 13_300_000_000,
        "CapturedGinkgoWriterOutput": output,
        "Failure": {"Message": message} if message else None,
    }


def test_parse_ginkgo_report_states_reasons_and_changes() -> None:
    report = [
        {
            "SpecReports": [
                {"LeafNodeType": "SynchronizedBeforeSuite", "State": "passed"},
                _spec("should deny ingress", "passed", SPEC_OUTPUT),
                _spec("should enforce SCTP", "skipped"),
                _spec("should need 3 nodes", "skipped", message="Requires at least 3 nodes\nmore"),
                _spec("should allow egress", "timedout", message="Timed out after 3h"),
            ]
        }
    ]
    cases, changes = parse_ginkgo_report(report, {"SCTP": "no SCTP sockets"})
    by_leaf = {c.name.rsplit("client ", 1)[1]: c for c in cases}
    assert len(cases) == 4
    assert by_leaf["should deny ingress"].state == "passed"
    assert by_leaf["should deny ingress"].seconds == 13.3
    assert by_leaf["should enforce SCTP"].reason == "no SCTP sockets"
    assert by_leaf["should need 3 nodes"].reason == "Requires at least 3 nodes"
    assert by_leaf["should allow egress"].state == "failed"
    assert by_leaf["should allow egress"].reason == "Timed out after 3h"
    assert [c.policy for c in changes] == ["creating x/deny-all", "updating x/deny-all"]


def test_parse_cyclonus_junit() -> None:
    xml = """<testsuite name="cyclonus" failures="1">
        <testcase name="ingress: allow all" classname=""></testcase>
        <testcase name="egress: deny all" classname="">
            <failure message="" type=""></failure>
        </testcase>
    </testsuite>"""
    cases = parse_cyclonus_junit(xml, "cyclonus pod-ip")
    assert [(c.name, c.state) for c in cases] == [
        ("ingress: allow all", "passed"),
        ("egress: deny all", "failed"),
    ]
    assert cases[1].reason


def test_summarize_enforcement() -> None:
    changes = [
        PolicyChange("a", "creating x/p", 0.004),
        PolicyChange("b", "creating x/q", 0.010),
        PolicyChange("c", "updating x/q", 0.002, wrong_probes=3, last_wrong_s=2.5, passed_denied=1),
    ]
    s = summarize_enforcement(changes)
    assert (s.changes, s.enforced_by_first_probe, s.retried, s.wrong_probes) == (3, 2, 1, 3)
    assert s.passed_denied == 1
    assert s.first_probe_median_ms == 4.0
    assert s.last_wrong_max_s == 2.5
    empty = summarize_enforcement([])
    assert empty.first_probe_median_ms is None and empty.last_wrong_max_s is None


def test_render_markdown_lists_failures_first_with_reasons() -> None:
    e2e = SuiteRun(
        "e2e Netpol",
        ["ginkgo", "run"],
        600.0,
        1,
        cases=[
            CaseResult("e2e", "spec ok", "passed", 12.0),
            CaseResult("e2e", "spec | sctp", "skipped", 0.0, "no SCTP sockets"),
            CaseResult("e2e", "spec bad", "failed", 30.0, "Had 2 wrong results"),
        ],
        changes=[PolicyChange("spec bad", "creating x/p", 0.003, 2, 1.5)],
    )
    cyclonus = SuiteRun("cyclonus pod-ip", ["cyclonus"], 120.0, 0, error="no JUnit file")
    run = ConformanceRun(
        "tabby", "abc1234", datetime(2026, 12, 4, 21, 0, tzinfo=UTC), 780.0, 48.0,
        {"kubernetes-e2e": "v1.36.3"}, {"SCTP": "no SCTP sockets"}, [e2e, cyclonus],
        "make conformance",
    )  # fmt: skip
    text = render_markdown(run)
    assert "2026-12-04 21:00 UTC; commit `abc1234`" in text
    assert "| e2e Netpol | 1 | 1 | 1 | 10.0 min | 1 |" in text
    assert "`SCTP`: no SCTP sockets" in text
    assert text.index("| failed | spec bad") < text.index("| skipped | spec \\| sctp")
    assert "Latest wrong probe: 1.5 s after its change" in text
    assert "**Did not complete:** no JUnit file" in text
    line = summary_line([e2e, cyclonus], 780.0)
    assert line.startswith("conformance total_min=13.0 ")
    assert "e2e_Netpol_passed=1 e2e_Netpol_failed=1" in line


def test_go_quote_meta_escapes_only_re2_metacharacters() -> None:
    assert go_quote_meta("a.b (c) 'x' [y]|z\\ ok") == "a\\.b \\(c\\) 'x' \\[y\\]\\|z\\\\ ok"


def test_the_report_names_the_make_invocation_it_came_from() -> None:
    assert _invocation(["--policy", "tabby"]) == "make conformance"
    assert (
        _invocation(["--policy=kube-network-policies", "--suite", "e2e"])
        == 'make conformance POLICY=kube-network-policies CONFORMANCE_ARGS="--suite e2e"'
    )


def _services_run(cni: str, states: dict[str, str], error: str = "") -> SuiteRun:
    cases = [
        CaseResult("e2e", name, state, 1.0, "timed out" if state == "failed" else "")
        for name, state in states.items()
    ]
    return SuiteRun(services_suite(cni, {}).name, ["ginkgo"], 60.0, 0, cases, error=error)


def test_compare_pass_lists_holds_tabby_to_every_spec_the_peer_passes() -> None:
    ours = _services_run("tabby", {"a": "passed", "b": "failed", "c": "passed", "d": "failed"})
    peer = _services_run(PEER_CNI, {"a": "passed", "b": "passed", "c": "failed", "d": "failed"})
    c = compare_pass_lists(ours, peer)
    assert c.only_peer == ["b"] and not c.ours_contains_peer
    assert c.only_ours == ["c"]
    assert [case.name for case in c.failed_both] == ["d"]
    assert c.both_passed == 1


def test_run_succeeded_judges_services_by_the_peer_and_netpol_by_failures() -> None:
    netpol = SuiteRun("e2e Netpol", ["ginkgo"], 60.0, 0, [CaseResult("e2e", "x", "passed")])
    ours = _services_run("tabby", {"a": "passed", "d": "failed"})
    peer = _services_run(PEER_CNI, {"a": "passed", "d": "failed"})
    assert run_succeeded([netpol, ours, peer])  # d fails for both: the lab's limit
    worse = _services_run("tabby", {"a": "failed", "d": "failed"})
    assert not run_succeeded([netpol, worse, peer])
    assert not run_succeeded([netpol, ours])  # the peer never ran: nothing to compare
    assert not run_succeeded([netpol, ours, _services_run(PEER_CNI, {}, error="no report")])
    failed = SuiteRun("e2e Netpol", ["ginkgo"], 60.0, 1, [CaseResult("e2e", "x", "failed")])
    assert not run_succeeded([failed, ours, peer])
    assert run_succeeded([netpol]) and not run_succeeded([])


def test_services_suite_skips_what_the_lab_lacks_with_reasons() -> None:
    suite = services_suite("tabby", {"SCTP": "no SCTP sockets"})
    assert suite.name == "e2e Services (tabby)" and suite.stem == "e2e-services-tabby"
    assert set(SERVICES_SKIPS) <= set(suite.skips) and suite.skips["SCTP"] == "no SCTP sockets"
    assert all(reason for reason in suite.skips.values())


def test_render_markdown_compares_tabby_with_the_peer() -> None:
    ours = _services_run("tabby", {"a": "passed", "c": "passed", "d": "failed"})
    peer = _services_run(PEER_CNI, {"a": "passed", "c": "failed", "d": "failed"})
    run = ConformanceRun(
        "tabby", "abc1234", datetime(2026, 12, 5, 9, 0, tzinfo=UTC), 60.0, 40.0,
        {}, {}, [ours, peer], "make conformance CONFORMANCE_ARGS=\"--suite services\"",
    )  # fmt: skip
    text = render_markdown(run)
    assert "## Services: Tabby against ptp + host-local" in text
    assert "- Tabby's pass list contains the peer's: yes" in text
    assert "- Passed with Tabby only: 1\n  - c" in text
    assert "- Failed with both (the lab's limits, not the CNI's): 1\n  - d: timed out" in text
    assert "e2e_Services_tabby_passed=2" in summary_line([ours, peer], 60.0)


def test_parse_ginkgo_report_leaves_out_specs_outside_the_focus() -> None:
    """The sig-network binary reports all its specs; only the focused ones count."""
    report = [
        {
            "SpecReports": [
                _spec("should deny ingress", "passed"),
                _spec("should enforce SCTP", "skipped"),  # focused, skipped by a pattern
                {**_spec("x", "skipped"), "ContainerHierarchyTexts": ["[sig-apps] Deployment"]},
            ]
        }
    ]
    cases, _ = parse_ginkgo_report(report, {"SCTP": "no SCTP sockets"}, focus="Netpol")
    assert [(c.name.rsplit("client ", 1)[-1], c.state) for c in cases] == [
        ("should deny ingress", "passed"),
        ("should enforce SCTP", "skipped"),
    ]


def test_service_ip_mode_leaves_out_the_cases_whose_pods_have_no_service_ip() -> None:
    """cyclonus v0.5.6 probes a pod created or relabelled mid-case at ":80" in
    service-ip mode (its own port): those tags run in pod-ip mode only."""
    pod_ip = cyclonus_excludes("pod-ip", exclude_sctp=True)
    service_ip = cyclonus_excludes("service-ip", exclude_sctp=True)
    assert "create-pod" not in pod_ip and "set-pod-labels" not in pod_ip
    assert set(service_ip) - set(pod_ip) == {"create-pod", "create-namespace", "set-pod-labels"}
    assert pod_ip[0] == "sctp" and "sctp" not in cyclonus_excludes("pod-ip", exclude_sctp=False)


def test_a_runs_notes_are_printed_under_its_command() -> None:
    run = SuiteRun("cyclonus service-ip", ["cyclonus", "generate"], 60.0, 0)
    run.notes = ["Cases tagged `create-pod` left out: no Service IP"]
    doc = ConformanceRun(
        "tabby", "abc1234", datetime(2026, 12, 5, tzinfo=UTC), 60.0, 40.0, {}, {}, [run],
        "make conformance",
    )  # fmt: skip
    text = render_markdown(doc)
    command_at = text.index("`cyclonus generate`")
    assert text.index("- Cases tagged `create-pod` left out: no Service IP") > command_at


def _mountinfo(*points: str) -> str:
    return "".join(
        f"{30 + i} 1 0:{40 + i} / {point} rw,relatime shared:1 - tmpfs tmpfs rw\n"
        for i, point in enumerate(points)
    )


def test_mounts_under_finds_a_lab_dirs_mounts_and_nothing_beside_it(tmp_path: Path) -> None:
    lab = tmp_path / "conformance-tabby"
    info = _mountinfo(
        "/", str(lab / "nodes/node1/rootfs"), str(tmp_path / "conformance-tabby-old"),
        str(lab).replace(" ", "\\040") + "/with\\040space",
    )  # fmt: skip
    assert mounts_under(lab, info) == [str(lab / "nodes/node1/rootfs"), f"{lab}/with space"]
    assert mounts_under(lab, _mountinfo("/", "/run")) == []


def test_a_torn_down_lab_dir_is_removed_unless_something_is_still_mounted(
    tmp_path: Path,
) -> None:
    lab = tmp_path / "conformance-tabby"
    (lab / "nodes" / "node1").mkdir(parents=True)
    (lab / "nodes" / "node1" / "image.tar").write_bytes(b"x" * 100)
    kept = remove_lab_dir(lab, _mountinfo("/", str(lab / "nodes" / "node1")))
    assert kept.startswith(f"kept {lab}") and (lab / "nodes" / "node1" / "image.tar").exists()
    assert remove_lab_dir(lab, _mountinfo("/")) == f"removed {lab}"
    assert not lab.exists()
    assert remove_lab_dir(lab, _mountinfo("/")) == f"{lab} is already gone"


# -- the network-policy-api suite (go test -v) ------------------------------------------------
GO_TEST_OUTPUT = """\
=== RUN   TestConformanceProfiles
    suite.go:157: Test Setup: Applying base manifests
=== RUN   TestConformanceProfiles/CNPAdminTierEgressNodePeers
=== RUN   TestConformanceProfiles/CNPAdminTierEgressNodePeers/Should_deny_egress
    helper.go:71: FAILED Command was [/agnhost connect --timeout=3s --protocol=sctp 1.2.3.4:9003]
    helper.go:71: Expected connection to be dropped ... OTHER: protocol not supported
    helper.go:70:
        \tError Trace:\thelper.go:70
        \tError:      \tCondition never satisfied
        \tTest:       \tTestConformanceProfiles/CNPAdminTierEgressNodePeers/Should
=== RUN   TestConformanceProfiles/CNPAdminTierEgressNodePeers/Should_allow_egress
=== RUN   TestConformanceProfiles/CNPAdminTierEgressTCP
=== RUN   TestConformanceProfiles/CNPAdminTierEgressTCP/Should_deny_TCP
    helper.go:71: FAILED Command was [/agnhost connect --timeout=3s --protocol=tcp 1.2.3.4:80]
    helper.go:71: Expected connection to be dropped ... but instead it successfully connected.
    helper.go:70:
        \tError Trace:\thelper.go:70
        \tError:      \tCondition never satisfied
        \tTest:       \tTestConformanceProfiles/CNPAdminTierEgressTCP/Should_deny_TCP
=== RUN   TestConformanceProfiles/CNPAdminTierEgressSCTP
    suite.go:216: Skipping CNPAdminTierEgressSCTP
=== RUN   TestConformanceProfiles/CNPAdminTierIngressNamedPort
    conformance.go:40: Skipping CNPAdminTierIngressNamedPort: suite does not support X
--- FAIL: TestConformanceProfiles (100.00s)
    --- FAIL: TestConformanceProfiles/CNPAdminTierEgressNodePeers (12.00s)
        --- FAIL: TestConformanceProfiles/CNPAdminTierEgressNodePeers/Should_deny_egress (10.50s)
        --- PASS: TestConformanceProfiles/CNPAdminTierEgressNodePeers/Should_allow_egress (1.50s)
    --- FAIL: TestConformanceProfiles/CNPAdminTierEgressTCP (10.00s)
        --- FAIL: TestConformanceProfiles/CNPAdminTierEgressTCP/Should_deny_TCP (10.00s)
    --- PASS: TestConformanceProfiles/CNPAdminTierEgressSCTP (0.00s)
    --- SKIP: TestConformanceProfiles/CNPAdminTierIngressNamedPort (0.00s)
FAIL
"""
NO_SCTP = "this kernel has no SCTP sockets"


def test_go_test_output_gives_each_leaf_subtest_with_why_it_failed() -> None:
    cases = {c.name: c for c in parse_go_test_verbose(GO_TEST_OUTPUT, "npapi", NPAPI_ROOT)}
    assert sorted(cases) == [
        "CNPAdminTierEgressNodePeers/Should allow egress",
        "CNPAdminTierEgressNodePeers/Should deny egress",
        "CNPAdminTierEgressSCTP",
        "CNPAdminTierEgressTCP/Should deny TCP",
        "CNPAdminTierIngressNamedPort",
    ]
    tcp = cases["CNPAdminTierEgressTCP/Should deny TCP"]
    assert (tcp.state, tcp.seconds) == ("failed", 10.0)
    assert "Condition never satisfied" in tcp.reason
    assert cases["CNPAdminTierEgressNodePeers/Should allow egress"].state == ("passed")
    listed = cases["CNPAdminTierEgressSCTP"]  # -skip-tests: go test says PASS
    assert (listed.state, listed.reason) == ("skipped", "listed in -skip-tests")
    skipped = cases["CNPAdminTierIngressNamedPort"]
    assert skipped.state == "skipped" and "suite does not support X" in skipped.reason
    # Without a kernel reason an SCTP probe's failure is an ordinary failure.
    sctp = cases["CNPAdminTierEgressNodePeers/Should deny egress"]
    assert sctp.state == "failed"


def test_failures_of_sctp_probes_alone_are_the_kernels_when_it_has_no_sctp() -> None:
    cases = {c.name: c for c in parse_go_test_verbose(GO_TEST_OUTPUT, "npapi", NPAPI_ROOT, NO_SCTP)}
    sctp = cases["CNPAdminTierEgressNodePeers/Should deny egress"]
    assert sctp.state == "kernel" and NO_SCTP in sctp.reason
    assert cases["CNPAdminTierEgressTCP/Should deny TCP"].state == "failed"  # a TCP probe
    assert cases["CNPAdminTierEgressSCTP"].reason == f"kernel: {NO_SCTP}"


def test_a_suite_whose_failures_are_all_the_kernels_succeeds() -> None:
    def run(*states: str, exit_code: int = 1) -> SuiteRun:
        cases = [CaseResult("npapi", f"c{i}", state) for i, state in enumerate(states)]
        return SuiteRun("npapi", [], 1.0, exit_code, cases)

    assert run_succeeded([run("passed", "kernel")])
    assert not run_succeeded([run("passed", "kernel", "failed")])
    assert not run_succeeded([run("passed")])  # exit 1 with nothing explaining it
    assert run_succeeded([run("passed", exit_code=0)])
    text = render_markdown(
        ConformanceRun(
            "tabby", "abc", datetime(2026, 12, 6, tzinfo=UTC), 60.0, 1.0, {}, {},
            [run("passed", "kernel")], "make conformance",
        )
    )  # fmt: skip
    assert "| npapi | 1 | 0 (+1 kernel) | 0 |" in text


def test_npapi_command_without_sctp_skips_the_sctp_tests_and_servers() -> None:
    binary, report = Path("/b/npapi-conformance-v0.3.0.test"), Path("/o/r.yaml")
    plain = npapi_command(binary, report, "abc123", None)
    assert "-conformance-profiles=ClusterNetworkPolicy" in plain
    assert (
        "-supported-features=ClusterNetworkPolicyNamedPorts,"
        "ClusterNetworkPolicyEgressNodePeers" in plain
    )
    assert "-version=abc123" in plain and f"-report-output={report}" in plain
    assert not any(a.startswith(("-skip-tests", "-base-manifests")) for a in plain)
    no_sctp = npapi_command(binary, report, "abc123", NO_SCTP)
    assert f"-base-manifests={NPAPI_NO_SCTP_BASE}" in no_sctp
    skip = next(a for a in no_sctp if a.startswith("-skip-tests="))
    assert set(skip.split("=", 1)[1].split(",")) == set(NPAPI_SCTP_TESTS)


def test_a_second_run_names_the_sctp_probes_it_left_out() -> None:
    output = """\
=== RUN   TestConformanceProfiles
=== RUN   TestConformanceProfiles/CNPAdminTierGress
=== RUN   TestConformanceProfiles/CNPAdminTierGress/Should_allow_gress
    helper.go:82: SCTP probe not run (NPAPI_SCTP_PROBES=skip): a/b -> 1.2.3.4:9003
    helper.go:82: SCTP probe not run (NPAPI_SCTP_PROBES=skip): a/b -> 1.2.3.5:9003
=== RUN   TestConformanceProfiles/CNPAdminTierGress/Should_pass_TCP
--- PASS: TestConformanceProfiles (9.00s)
    --- PASS: TestConformanceProfiles/CNPAdminTierGress (9.00s)
        --- PASS: TestConformanceProfiles/CNPAdminTierGress/Should_allow_gress (5.00s)
        --- PASS: TestConformanceProfiles/CNPAdminTierGress/Should_pass_TCP (4.00s)
PASS
"""
    cases = {c.name: c for c in parse_go_test_verbose(output, "again", NPAPI_ROOT)}
    assert cases["CNPAdminTierGress/Should allow gress"].reason == "2 SCTP probes not run"
    assert cases["CNPAdminTierGress/Should pass TCP"].reason == ""
    assert npapi_run_pattern(["CNPAdminTierGress", "CNPBaselineTierGress"]) == (
        "^TestConformanceProfiles$/^(CNPAdminTierGress|CNPBaselineTierGress)$"
    )


def test_the_suite_and_the_crd_come_from_one_network_policy_api_release() -> None:
    repo = Path(__file__).resolve().parents[3]
    pins = {
        name: re.search(r"^NPAPI_VERSION=(\S+)", (repo / "hack" / name).read_text(), re.M)
        for name in ("build-e2e.sh", "gen-cnp-crd.sh")
    }
    versions = {name: m.group(1) for name, m in pins.items() if m}
    assert len(versions) == 2 and len(set(versions.values())) == 1, versions
    go_mod = (repo / "hack" / "go" / "npapi-conformance" / "go.mod").read_text()
    assert f"sigs.k8s.io/network-policy-api {versions['build-e2e.sh']}" in go_mod


def test_suites_are_a_comma_list_and_all_is_each_of_them() -> None:
    assert parse_suites("e2e,cyclonus") == {"e2e", "cyclonus"}
    assert parse_suites(" cyclonus ") == {"cyclonus"}
    assert parse_suites("all") == {"e2e", "cyclonus", "services", "cnp"}
    assert parse_suites("e2e,all") == parse_suites("all")


def test_an_unknown_or_empty_suite_is_refused_naming_it() -> None:
    for bad, named in (("e2e,netpol", "netpol"), (",", "none"), ("", "none")):
        try:
            parse_suites(bad)
        except ValueError as err:
            assert named in str(err) and "e2e" in str(err)
        else:
            raise AssertionError(f"{bad!r} was accepted")


def test_the_report_names_the_versions_of_the_suites_that_ran_only() -> None:
    versions = {
        "cyclonus": "v0.5.6",
        "ginkgo": "v2.28.1",
        "kubernetes-e2e": "v1.36.3",
        "network-policy-api": "v0.3.0",
    }
    e2e = SuiteRun("e2e Netpol", ["ginkgo"], 1.0, 0)
    cyclonus = SuiteRun("cyclonus pod-ip", ["cyclonus"], 1.0, 0)
    assert versions_used(versions, [e2e, cyclonus]) == [
        ("cyclonus", "v0.5.6"),
        ("ginkgo", "v2.28.1"),
        ("kubernetes-e2e", "v1.36.3"),
    ]
    cnp = SuiteRun("network-policy-api ClusterNetworkPolicy", ["go", "test"], 1.0, 0)
    assert versions_used(versions, [cnp]) == [("network-policy-api", "v0.3.0")]
    assert versions_used(versions, []) == []
    run = ConformanceRun(
        "tabby", "abc1234", datetime(2026, 12, 4, 21, 0, tzinfo=UTC), 60.0, 40.0,
        versions, {}, [cyclonus], "make conformance",
    )  # fmt: skip
    assert "- Suites: cyclonus v0.5.6\n" in render_markdown(run)
