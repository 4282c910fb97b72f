"""`tabbyctl cni install` (plugin + conflist) and `tabbyctl endpoints` (a node's pods)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cni import install
from tabbyctl.output import emit_data, emit_table, fail, output_option, warn

DEFAULT_RUN_DIR = "/run/tabby"


@click.group("cni")
def cni() -> None:
    """Install the tabby CNI plugin."""


@cni.command("install")
@click.option(
    "--bin-dir",
    type=click.Path(path_type=Path),
    default=Path("/opt/cni/bin"),
    show_default=True,
    help="CNI plugin directory of the runtime.",
)
@click.option(
    "--conf-dir",
    type=click.Path(path_type=Path),
    default=Path("/etc/cni/net.d"),
    show_default=True,
    help="CNI config directory of the runtime.",
)
@click.option(
    "--socket",
    "socket_path",
    default=f"{DEFAULT_RUN_DIR}/cni.sock",
    show_default=True,
    help="The node agent's CNI socket (tabby-node --run-dir).",
)
@click.option("--mtu", type=click.IntRange(576, 9000), default=1500, show_default=True)
@click.option(
    "--from",
    "source",
    type=click.Path(path_type=Path),
    default=install.EXECUTABLES_DIR,
    show_default=True,
    help="Folder holding the static executables to copy (the image carries them here).",
)
@click.option("--no-portmap", is_flag=True, help="Do not chain the portmap plugin.")
@click.option("--no-bandwidth", is_flag=True, help="Do not chain the bandwidth plugin.")
def install_cmd(
    bin_dir: Path,
    conf_dir: Path,
    socket_path: str,
    mtu: int,
    source: Path,
    no_portmap: bool,
    no_bandwidth: bool,
) -> None:
    """Copy the static tabby executable (and the chained portmap and bandwidth) to
    BIN_DIR, and write the network config to CONF_DIR. Nothing else on the node is
    needed: no interpreter, no CNI plugins of its own."""
    if not socket_path.startswith("/"):
        fail(f"--socket must be an absolute path, got {socket_path!r}")
    chained = [
        name for name, off in (("portmap", no_portmap), ("bandwidth", no_bandwidth)) if not off
    ]
    try:
        written = install.install_executables(bin_dir, source, chained)
    except (install.InstallError, OSError) as exc:
        fail(str(exc))
    config = install.conflist(
        socket=socket_path, mtu=mtu, chain_portmap=not no_portmap, chain_bandwidth=not no_bandwidth
    )
    missing = [name for name in chained if not (bin_dir / name).exists()]
    conflist, others = install.install_config(conf_dir, config)
    for path in written:
        click.echo(f"installed {path}")
    click.echo(f"installed network config {conflist}")
    if missing:
        warn(
            f"chained plugins not found in {bin_dir}: {', '.join(missing)} (install them, "
            "or pass --no-portmap/--no-bandwidth)"
        )
    if others:
        first = sorted([conflist.name, *others])[0]
        warn(
            f"other CNI configs in {conf_dir}: {', '.join(others)}; the runtime uses only the "
            f"first in lexical order ({first})"
        )


def read_status(run_dir: Path) -> dict[str, Any]:
    """The agent's status file (written after every dataplane pass)."""
    path = run_dir / "status.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        fail(
            f"no agent status at {path}: is tabby-node running on this node (or pass --run-dir)?",
            code=1,
        )
        raise  # unreachable; for the type checker
    except ValueError as exc:
        fail(f"agent status {path} is not valid JSON: {exc}", code=1)
        raise
    return data


@click.command("endpoints")
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    default=Path(DEFAULT_RUN_DIR),
    show_default=True,
    help="The node agent's run directory.",
)
@output_option
def endpoints(run_dir: Path, output: str) -> None:
    """List the workload endpoints (pods) wired on this node."""
    status = read_status(run_dir)
    rows = status.get("endpoints", [])
    if output != "table":
        emit_data({"node": status.get("node"), "endpoints": rows}, output)
        return
    emit_table(
        f"Workload endpoints on {status.get('node', '?')}",
        ["NAMESPACE", "POD", "INTERFACE", "IP", "CONTAINER ID"],
        [
            [
                r.get("namespace"),
                r.get("pod"),
                r.get("interface"),
                r.get("ip"),
                str(r.get("container_id", ""))[:13],
            ]
            for r in rows
        ],
    )
