"""Install the `tabby` CNI plugin and its network config, as the DaemonSet's init
container and `tabbyctl cni install` do. Standard library only.

The plugin is the shim file with a `python3 -I -S` shebang (isolated, no site
packages: it needs none and starts faster). The conflist names Tabby first so the
runtime uses it; other configs already in the directory are reported, because a
runtime only uses the first one in lexical order.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

SHIM = Path(__file__).with_name("shim.py")
CONFLIST_NAME = "10-tabby.conflist"
NETWORK_NAME = "k8s-pod-network"


def conflist(
    *,
    socket: str,
    mtu: int = 1500,
    chain_portmap: bool = True,
    chain_bandwidth: bool = True,
    cni_version: str = "1.0.0",
) -> dict[str, object]:
    """The network config: tabby, then the reference portmap and bandwidth plugins."""
    plugins: list[dict[str, object]] = [
        {"type": "tabby", "mtu": mtu, "agent_socket": socket},
    ]
    if chain_portmap:
        plugins.append({"type": "portmap", "capabilities": {"portMappings": True}, "snat": True})
    if chain_bandwidth:
        plugins.append({"type": "bandwidth", "capabilities": {"bandwidth": True}})
    return {"cniVersion": cni_version, "name": NETWORK_NAME, "plugins": plugins}


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write via a temp file + rename: a runtime never sees a half-written plugin."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install_plugin(bin_dir: Path, python: str = sys.executable) -> Path:
    """Copy the shim to bin_dir/tabby with a shebang for this interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    body = (
        SHIM.read_text().split("\n", 1)[1]
        if SHIM.read_text().startswith("#!")
        else SHIM.read_text()
    )
    target = bin_dir / "tabby"
    # One shebang argument only (the kernel passes the rest as a single word): -IS.
    _atomic_write(target, f"#!{python} -IS\n{body}".encode(), 0o755)
    return target


def install_config(conf_dir: Path, config: dict[str, object]) -> tuple[Path, list[str]]:
    """Write the conflist; return it and the names of other configs that compete with it."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    target = conf_dir / CONFLIST_NAME
    _atomic_write(target, (json.dumps(config, indent=2) + "\n").encode(), 0o644)
    others = sorted(
        p.name
        for p in conf_dir.iterdir()
        if p.name != CONFLIST_NAME and p.suffix in (".conf", ".conflist", ".json")
    )
    return target, others
