"""`tabby-controllers`: the cluster-wide IPAM garbage collector and policy status.

Runs as the tabby-controllers Deployment (one replica). Each GC pass releases leaked
addresses past their grace period, empty blocks, and the blocks and affinities of
deleted nodes (ipam/gc.py). A successful pass touches the heartbeat file, which the
liveness probe checks; a failed pass is logged and retried next interval. SIGTERM
ends the wait between passes at once.

Beside it, in its own thread, the policy status controller
(controllers/policy_status.py) writes each policy's realization on the policy objects.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from controllers.policy_status import PolicyStatusController
from datastore.client import Datastore
from datastore.errors import NotConfigured
from datastore.incluster import choose_kubeconfig
from felix import logs
from ipam.gc import DEFAULT_GRACE_S, GCResult, IPAMGarbageCollector

log = logging.getLogger("tabby-controllers")

DEFAULT_INTERVAL_S = DEFAULT_GRACE_S / 2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="tabby-controllers", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kubeconfig", help="default: $KUBECONFIG, else the pod's ServiceAccount (in-cluster)"
    )
    parser.add_argument(
        "--gc-grace-seconds",
        type=_positive,
        default=env("GC_GRACE_SECONDS", str(DEFAULT_GRACE_S)),
        help="how long a leak must persist before it is released (default: %(default)s)",
    )
    parser.add_argument(
        "--gc-interval-seconds",
        type=_positive,
        default=env("GC_INTERVAL_SECONDS", str(DEFAULT_INTERVAL_S)),
        help="time between passes (default: %(default)s)",
    )
    parser.add_argument(
        "--heartbeat-file",
        type=Path,
        default=env("HEARTBEAT_FILE"),
        help="touched after each successful pass, for the liveness probe",
    )
    parser.add_argument(
        "--once", action="store_true", help="run one GC pass and exit (1 on failure)"
    )
    parser.add_argument(
        "--no-policy-status",
        dest="policy_status",
        action="store_false",
        default=env("POLICY_STATUS", "on") != "off",
        help="do not write policy realization on the policy objects (env POLICY_STATUS=off)",
    )
    parser.add_argument("--log-level", default=env("TABBY_LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    try:
        args.kubeconfig = choose_kubeconfig(args.kubeconfig)  # None: in-cluster
    except NotConfigured as exc:
        parser.error(str(exc))
    return args


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def run_pass(gc: IPAMGarbageCollector, heartbeat: Path | None) -> GCResult | None:
    """One pass, logged; None when it failed (the next interval retries)."""
    try:
        result = gc.run_once()
    except Exception:
        log.exception("ipam gc pass failed; retrying next interval")
        return None
    log.info(
        "ipam gc pass",
        extra={
            "released_ips": [str(ip) for ip in result.released_ips],
            "released_blocks": result.released_blocks,
            "deleted_blocks": result.deleted_blocks,
            "cleaned_nodes": result.cleaned_nodes,
            "leak_candidates": result.leak_candidates,
        },
    )
    if heartbeat is not None:
        heartbeat.touch()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure(args.log_level)
    try:
        datastore = Datastore.connect(args.kubeconfig)
    except NotConfigured as exc:
        print(f"tabby-controllers: error: {exc}", file=sys.stderr)
        return 2
    gc = IPAMGarbageCollector(datastore, grace=args.gc_grace_seconds)
    if args.once:
        return 0 if run_pass(gc, args.heartbeat_file) is not None else 1
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    status = PolicyStatusController(datastore) if args.policy_status else None
    if status is not None:
        status.start()
    log.info(
        "ipam gc started",
        extra={"interval_s": args.gc_interval_seconds, "grace_s": args.gc_grace_seconds},
    )
    while not stop.is_set():
        run_pass(gc, args.heartbeat_file)
        stop.wait(args.gc_interval_seconds)
    if status is not None:
        status.stop()
    log.info("ipam gc stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
