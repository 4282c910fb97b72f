"""lab.refpolicy's pure parts: what the reference implementation is run with."""

from __future__ import annotations

from pathlib import Path

from lab.refpolicy import CHAIN, QUEUE, nfqueue_rules, process_argv


def test_nfqueue_rules_queue_new_pod_flows_but_not_the_nodes_own_root_traffic() -> None:
    rules = nfqueue_rules("10.244.0.0/16")
    assert rules[0] == ["-t", "mangle", "-N", CHAIN]
    returns = [r for r in rules if r[-1] == "RETURN"]
    assert returns[0][6:8] == ["--uid-owner", "0"]  # upstream: meta skuid 0 accept
    assert "ESTABLISHED,RELATED" in returns[1]  # upstream: ct state established,related
    queued = [r for r in rules if "NFQUEUE" in r]
    assert {(r[4], r[5]) for r in queued} == {("-s", "10.244.0.0/16"), ("-d", "10.244.0.0/16")}
    assert all(r[-1] == str(QUEUE) and "--queue-bypass" not in r for r in queued)  # fail closed
    assert rules[-1] == ["-t", "mangle", "-A", "POSTROUTING", "-j", CHAIN]
    # The returns come before the queue rules, and the hook is added last.
    assert rules.index(returns[1]) < rules.index(queued[0])


def test_process_argv_stages_credentials_in_a_private_mount_namespace() -> None:
    argv = process_argv(Path("/c/knp"), "node2", Path("/run/labs/x/sa"), "172.31.0.2", 6443)
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    script = argv[-1]
    steps = script.split(" && ")
    assert steps.index("cp /run/labs/x/sa/* /mnt/") < steps.index("mount -t tmpfs tmpfs /run")
    assert steps[-1].startswith("exec env KUBERNETES_SERVICE_HOST=172.31.0.2 ")
    assert "--hostname-override=node2" in steps[-1] and f"--nfqueue-id={QUEUE}" in steps[-1]
