"""`tabbyctl ipam`: show usage, check consistency, release leaked addresses.

Mirrors calicoctl ipam (show, check, release). Errors a person can act on exit
with code 2 and change nothing; `check` exits 1 when it finds problems.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict
from ipaddress import IPv4Address, IPv4Network
from typing import Any, TypeVar

import click

from datastore.client import Datastore
from datastore.errors import DatastoreError
from ipam.allocator import IPAMAllocator
from ipam.errors import IPAMError
from ipam.report import (
    CheckReport,
    PoolUsage,
    Snapshot,
    borrowed,
    check,
    pool_usage,
    read_report_leaks,
    write_report,
)
from tabbyctl.output import emit_data, emit_table, fail, output_option, warn

F = TypeVar("F", bound=Callable[..., Any])
RELEASER_NODE = "tabbyctl"


def _errors_to_exit(fn: F) -> F:
    """Turn IPAM and datastore errors into 'Error: ...' with exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (IPAMError, DatastoreError, ValueError) as exc:
            fail(str(exc))

    return wrapper  # type: ignore[return-value]


def _datastore(ctx: click.Context) -> Datastore:
    datastore: Datastore = ctx.obj.datastore
    return datastore


@click.group()
def ipam() -> None:
    """IP address management: pools, blocks, allocations."""


# -- show -----------------------------------------------------------------------------
@ipam.command()
@click.option("--ip", "ip", help="Show who holds this address.")
@click.option("--show-blocks", is_flag=True, help="Add a row per block under each pool.")
@click.option("--show-borrowed", is_flag=True, help="List addresses borrowed across nodes.")
@click.option("--show-configuration", is_flag=True, help="Show the IPAM configuration.")
@output_option
@click.pass_context
@_errors_to_exit
def show(
    ctx: click.Context,
    ip: str | None,
    show_blocks: bool,
    show_borrowed: bool,
    show_configuration: bool,
    output: str,
) -> None:
    """Pool usage (like `calicoctl ipam show`)."""
    if sum(map(bool, (ip, show_blocks, show_borrowed, show_configuration))) > 1:
        fail("use at most one of --ip, --show-blocks, --show-borrowed, --show-configuration")
    snapshot = Snapshot.load(_datastore(ctx), with_k8s=False)
    if ip:
        _show_ip(snapshot, ip, output)
    elif show_borrowed:
        _show_borrowed(snapshot, output)
    elif show_configuration:
        _show_configuration(snapshot, output)
    else:
        _show_usage(pool_usage(snapshot), show_blocks, output)
    _warn_corrupt(snapshot)


def _warn_corrupt(snapshot: Snapshot) -> None:
    """Corrupt blocks are left out of what `show` counts: say so, on stderr."""
    for model, reason in snapshot.corrupt_blocks():
        warn(f"{reason}; IPAMBlock {model.name} is left out (see `tabbyctl ipam check`)")


def _pct(part: int, total: int) -> str:
    return f"{part:.5g} ({100 * part / total:.0f}%)" if total else "0"


def _show_usage(usage: list[PoolUsage], show_blocks: bool, output: str) -> None:
    if output != "table":
        data = [asdict(u) for u in usage]
        if not show_blocks:
            for entry in data:
                entry.pop("blocks")
        emit_data(data, output)
        return
    rows: list[list[Any]] = []
    for pool in usage:
        grouping = "IP Pool (disabled)" if pool.disabled else "IP Pool"
        rows.append(
            [
                grouping,
                pool.cidr,
                f"{pool.total:.5g}",
                _pct(pool.in_use, pool.total),
                _pct(pool.free, pool.total),
            ]
        )
        if show_blocks:
            for block in pool.blocks:
                total = block.in_use + block.free
                rows.append(
                    [
                        f"Block ({block.owner or 'no affinity'})",
                        block.cidr,
                        total,
                        _pct(block.in_use, total),
                        _pct(block.free, total),
                    ]
                )
    emit_table(None, ["GROUPING", "CIDR", "IPS TOTAL", "IPS IN USE", "IPS FREE"], rows)


def _show_borrowed(snapshot: Snapshot, output: str) -> None:
    entries = borrowed(snapshot)
    if output != "table":
        emit_data([asdict(e) for e in entries], output)
        return
    rows = [
        [e.ip, e.borrowing_node, e.block, e.block_owner or "", e.type, e.allocated_to]
        for e in entries
    ]
    emit_table(None, ["IP", "BORROWING-NODE", "BLOCK", "BLOCK OWNER", "TYPE", "ALLOCATED-TO"], rows)
    without_node = sum(
        1
        for _, b in snapshot.allocation_blocks()
        for a in b.iter_allocations()
        if not a.attrs.get("node")
    )
    if without_node:
        click.echo(f"{without_node} allocated IP(s) have no node attribute and are not listed.")


def _show_configuration(snapshot: Snapshot, output: str) -> None:
    data = snapshot.config.model_dump(by_alias=True)
    if output != "table":
        emit_data(data, output)
        return
    emit_table(None, ["PROPERTY", "VALUE"], [[k, str(v)] for k, v in data.items()])


def _show_ip(snapshot: Snapshot, text: str, output: str) -> None:
    address = IPv4Address(text)
    for model, reason in snapshot.corrupt_blocks():
        if address in IPv4Network(model.spec.cidr):
            fail(f"{address} lies in a corrupt block, which cannot be read: {reason}")
    for _, block in snapshot.allocation_blocks():
        if address in block.cidr:
            allocation = block.allocation(address)
            if allocation is not None:
                data = {
                    "ip": str(address),
                    "inUse": True,
                    "block": str(block.cidr),
                    "handleID": allocation.handle_id,
                    "attributes": allocation.attrs,
                }
                _emit_ip(data, output)
                return
    _emit_ip({"ip": str(address), "inUse": False}, output)


def _emit_ip(data: dict[str, Any], output: str) -> None:
    if output != "table":
        emit_data(data, output)
        return
    if not data["inUse"]:
        click.echo(f"{data['ip']} is not assigned")
        return
    click.echo(f"IP {data['ip']} is in use")
    click.echo(f"Handle ID: {data['handleID']}")
    click.echo("Active Owner Attributes:")
    for key, value in sorted(data["attributes"].items()):
        click.echo(f"  {key}: {value}")


# -- check ----------------------------------------------------------------------------
@ipam.command(name="check")
@click.option(
    "-r",
    "--report",
    "report_file",
    type=click.Path(dir_okay=False, writable=True),
    help="Write a JSON report; `ipam release --from-report` releases its leaks.",
)
@output_option
@click.pass_context
@_errors_to_exit
def check_cmd(ctx: click.Context, report_file: str | None, output: str) -> None:
    """Check blocks, handles and affinities against each other and against pods.

    Exits 1 when it finds problems.
    """
    report = check(Snapshot.load(_datastore(ctx)))
    if report_file:
        try:
            write_report(report, report_file)
        except OSError as exc:
            fail(f"cannot write report {report_file}: {exc.strerror}")
    if output != "table":
        emit_data(report.to_json(), output)
    else:
        _print_check(report)
    if report.problem_count:
        ctx.exit(1)


def _print_check(report: CheckReport) -> None:
    click.echo(f"Checked {report.allocations} allocated address(es).")
    for problem in report.problems:
        click.echo(f"  [{problem.kind}] {problem.message}")
    if report.leaks:
        click.echo(f"Found {len(report.leaks)} address(es) allocated in IPAM but not in use:")
        for leak in report.leaks:
            click.echo(f"  {leak.ip} (handle {leak.handle}): {leak.reason}")
    click.echo(f"Check complete; found {report.problem_count} problems.")


# -- release --------------------------------------------------------------------------
@ipam.command()
@click.option("--ip", "ips", multiple=True, help="An address to release (repeatable).")
@click.option(
    "--from-report",
    "reports",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Release the leaks common to all these `ipam check --report` files.",
)
@output_option
@click.pass_context
@_errors_to_exit
def release(
    ctx: click.Context, ips: tuple[str, ...], reports: tuple[str, ...], output: str
) -> None:
    """Release addresses, by hand or from check reports."""
    if bool(ips) == bool(reports):
        fail("give either --ip or --from-report (exactly one of them)")
    releaser = IPAMAllocator(_datastore(ctx), RELEASER_NODE)
    if ips:
        addresses = [IPv4Address(ip) for ip in ips]
        _refuse_unallocated(ctx, addresses)
        result = releaser.release_ips(addresses)
    else:
        leaks = _common_leaks(reports)
        seqs = {
            IPv4Address(leak.ip): leak.sequence_number
            for leak in leaks
            if leak.sequence_number is not None
        }
        result = releaser.release_ips([IPv4Address(leak.ip) for leak in leaks], seqs)
    data = {
        "released": [str(a) for a in result.released],
        "notAllocated": [str(a) for a in result.not_allocated],
        "reassignedSinceReport": [str(a) for a in result.stale],
    }
    if output != "table":
        emit_data(data, output)
        return
    click.echo(f"Released {len(result.released)} address(es).")
    for address in result.stale:
        click.echo(f"  kept {address}: reassigned since the report was written")
    for address in result.not_allocated:
        click.echo(f"  skipped {address}: no longer allocated")


def _refuse_unallocated(ctx: click.Context, addresses: list[IPv4Address]) -> None:
    """With --ip, every address must be allocated, or nothing is released."""
    snapshot = Snapshot.load(_datastore(ctx), with_k8s=False)
    held: set[IPv4Address] = set()
    for _, block in snapshot.allocation_blocks():
        held |= {a.ip for a in block.iter_allocations()}
    missing = [str(a) for a in addresses if a not in held]
    if missing:
        fail(f"{', '.join(missing)} is not allocated; nothing was released")


def _common_leaks(reports: tuple[str, ...]) -> list[Any]:
    """Leaks present (same address, handle and sequence number) in every report."""
    per_report = [read_report_leaks(path) for path in reports]
    keys = [{(x.ip, x.handle, x.sequence_number) for x in leaks} for leaks in per_report]
    common = set.intersection(*keys)
    return [x for x in per_report[0] if (x.ip, x.handle, x.sequence_number) in common]
