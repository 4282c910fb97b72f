"""Install Tabby's CNI executables and its network config, as the DaemonSet's init
container and `tabbyctl cni install` do. Standard library only.

What a node runs (`install_executables`): the static executables the image carries
at /usr/lib/tabby/cni (hack/build-cni.sh builds them; Go, no cgo): `tabby`, the
forwarder to the node agent (cni/forwarder), and the reference `portmap` and
`bandwidth` that the conflist chains. A node needs no interpreter and no CNI
plugins of its own: kind, Container-Optimized OS, Bottlerocket, Talos and Flatcar
have no Python.

The Python shim (cni/shim.py, `install_shim`) is not installed on nodes any more.
It stays as the reference the executable keeps the rules of (the tests run every
bad-input case through both) and as the plugin of the namespace lab and the CNI
latency benchmark, which run on a host that has Python. Its launcher has a
`python3 -I -S` shebang and imports the shim from `tabby.d/` beside it, whose
bytecode install writes ahead.

The conflist names Tabby first so the runtime uses it; other configs already in the
directory are reported, because a runtime only uses the first one in lexical order.
"""

from __future__ import annotations

import json
import os
import py_compile
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

SHIM = Path(__file__).with_name("shim.py")
SHIM_MODULE = "tabby_shim"
CONFLIST_NAME = "10-tabby.conflist"
LAUNCHER = """#!{python} -IS
# Tabby's CNI plugin: runs the shim kept (with its cached bytecode) in tabby.d/ beside it.
import sys
sys.path.insert(0, __file__ + ".d")
from {module} import main
sys.exit(main())
"""
NETWORK_NAME = "k8s-pod-network"
# Where the image carries the node-side executables (lab/images.py, Dockerfile).
EXECUTABLES_DIR = Path("/usr/lib/tabby/cni")
PLUGIN = "tabby"
CHAINED = ("portmap", "bandwidth")


class InstallError(RuntimeError):
    """What cannot be installed, said so that an operator can act on it."""


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


def install_executables(
    bin_dir: Path, source: Path = EXECUTABLES_DIR, chained: Sequence[str] = CHAINED
) -> list[Path]:
    """Copy `tabby` and the chained plugins from source to bin_dir, each atomically (a
    runtime calling the plugin meanwhile runs the old or the new file, never half of
    one); returns what was written. `tabby` must be there; a chained plugin may be
    absent from source when the node has its own (install warns about neither)."""
    if not (source / PLUGIN).is_file():
        raise InstallError(
            f"no {PLUGIN} executable in {source}: run the Tabby image's install-cni, or "
            "build it with hack/build-cni.sh and pass its folder as --from"
        )
    bin_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in (PLUGIN, *chained):
        if (source / name).is_file():
            _atomic_write(bin_dir / name, (source / name).read_bytes(), 0o755)
            written.append(bin_dir / name)
    return written


def install_shim(bin_dir: Path, python: str = sys.executable) -> Path:
    """Write bin_dir/tabby (the shim's launcher) and bin_dir/tabby.d/ (the shim,
    compiled): the reference plugin, for hosts with Python only (module docstring)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / "tabby"
    module_dir = bin_dir / "tabby.d"
    module_dir.mkdir(exist_ok=True)
    module = module_dir / f"{SHIM_MODULE}.py"
    _atomic_write(module, SHIM.read_bytes(), 0o644)
    py_compile.compile(str(module), doraise=True)
    # One shebang argument only (the kernel passes the rest as a single word): -IS.
    launcher = LAUNCHER.format(python=python, module=SHIM_MODULE)
    _atomic_write(target, launcher.encode(), 0o755)
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
