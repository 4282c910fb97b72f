"""NetworkPolicy truth table: real packets on a 2-node lab, checked against an oracle.

Standalone, as root::

    .venv/bin/python tests/bench/policy_truth_table.py [--backend nft|legacy|both]

For each backend it starts its own lab (etcd + kube-apiserver, two node
namespaces with real ``tabby-node`` agents programming that iptables backend,
BGP between them), creates namespaces x, y, z (``kubernetes.io/metadata.name``)
and pods a, b, c (``pod=<name>``) spread over both nodes, each pod running a
server for TCP, UDP and SCTP on ports 80 and 81 (named ``serve-<port>-<proto>``,
plus a per-pod ``alt``), and emulates kube-proxy: one ClusterIP per pod, DNAT in
the node namespaces' nat table. Then every case of ``tests/truthtable/cases.py``
runs: after each step, every ordered pair of distinct pods is probed on every
port and protocol, by pod address and by Service address, in parallel, and each
result is compared with the matrix computed by the independent oracle
(``tests/unit/policy/oracle.py``, which shares no code with the compiler).

SCTP: this kernel has no SCTP sockets, so SCTP probes are hand-built INIT
packets on raw sockets, answered by INIT-ACKs (see ``tests/truthtable/podagent.py``);
netfilter's SCTP match, conntrack and NAT handle them as for a real stack.

Everything created is removed at the end, also on failure or SIGTERM. The last
line is::

    policy_truth cases=N probes=M mismatches=K backends=nft,legacy
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.truthtable.cases import CASES, FEATURES, uncovered  # noqa: E402
from tests.truthtable.harness import TruthLab  # noqa: E402
from tests.truthtable.runner import BackendResult, run_cases  # noqa: E402


def _say(line: str) -> None:
    print(line, flush=True)


def run_backend(backend: str, work: Path, names: set[str] | None) -> BackendResult:
    """One lab, every case, torn down whatever happens."""
    started = time.monotonic()
    lab = TruthLab.up(work / backend, backend, lambda m: _say(f"[{backend}] {m}"))
    try:
        up_s = time.monotonic() - started
        _say(f"[{backend}] lab and {len(lab.world.pods)} pods up in {up_s:.0f} s")
        for key, node in lab.world.placement.items():
            service = lab.world.cluster_ips[key]
            _say(f"    {key:4s} {lab.world.ip(key):15s} on {node}, service {service}")
        cases = [c for c in CASES if names is None or c.name in names]
        result = run_cases(lab, cases, _say)
    finally:
        lab.down()
    _say(f"[{backend}] done in {time.monotonic() - started:.0f} s")
    return result


def _summary(result: BackendResult) -> None:
    settle = sorted(result.converge_s)
    _say(
        f"{result.backend}: {result.cases} cases, {result.steps} steps, {result.cells} cells "
        f"checked ({result.allowed} open, {result.same_node} same-node), {result.probes} "
        f"probes sent, settle median {statistics.median(settle):.1f} s max {settle[-1]:.1f} s, "
        f"refused {result.refused}, mismatches {len(result.mismatches)}"
    )
    for line in result.mismatches[:50]:
        _say(f"  {line}")


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("nft", "legacy", "both"), default="both")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    missing = uncovered()
    if missing:
        print(f"cases do not cover {sorted(missing)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    backends = ["nft", "legacy"] if opts.backend == "both" else [opts.backend]
    names = set(opts.cases.split(",")) if opts.cases else None
    started = time.monotonic()
    _say(f"features covered: {', '.join(FEATURES)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="tbt-truth-") as work:
        for backend in backends:
            results.append(run_backend(backend, Path(work), names))
    for result in results:
        _summary(result)
    _say(f"total {time.monotonic() - started:.0f} s")
    cases = results[0].cases
    probes = sum(r.cells for r in results)
    mismatches = sum(len(r.mismatches) for r in results)
    _say(
        f"policy_truth cases={cases} probes={probes} mismatches={mismatches} "
        f"backends={','.join(backends)}"
    )
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
