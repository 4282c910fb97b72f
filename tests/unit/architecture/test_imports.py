"""Import rules that keep the layers honest (import-linter checks the package layers;
this test adds the standard-library-level rules import-linter cannot express).

- The CNI executable runs once per pod with `python3 -I -S`: standard library only,
  and only the cheap modules.
- The policy compiler and the pure IPAM logic do no I/O: no sockets, subprocesses,
  kernel or apiserver clients, directly or through another Tabby package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

# The C cores of json and socket; `json` itself only on the error path (lazily).
# fcntl: built in, imported only when ADD/CHECK check that CNI_NETNS is a network namespace
SHIM_ALLOWED = {
    "_json",
    "_socket",
    "json",
    "os",
    "sys",
    "errno",
    "__future__",
    "typing",
    "time",
    "fcntl",
}
IO_MODULES = {
    "subprocess",
    "socket",
    "http",
    "urllib",
    "urllib3",
    "requests",
    "kubernetes",
    "pyroute2",
    "iptc",
    "exabgp",
    "datastore",
    "felix",
    "lab",
    "bgp",
    "cni",
    "tabbyctl",
    "asyncio",
    "multiprocessing",
    "threading",
    "shutil",
}
# Typed data and string codecs without I/O that pure code may use.
PURE_ALLOWED = {"datastore.models", "datastore.kinds", "datastore.errors", "urllib.parse"}
PURE_FILES = [
    *sorted((REPO / "policy").glob("*.py")),
    REPO / "ipam" / "block.py",
    REPO / "ipam" / "pools.py",
    REPO / "ipam" / "selector.py",
]


def _dotted_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _dotted_imports(path)}


def test_cni_shim_imports_only_cheap_standard_library_modules() -> None:
    extra = _imports(REPO / "cni" / "shim.py") - SHIM_ALLOWED
    assert not extra, f"cni/shim.py must stay standard-library-light; remove imports of {extra}"


@pytest.mark.parametrize("path", [p for p in PURE_FILES if p.exists()], ids=lambda p: p.name)
def test_pure_modules_do_no_io(path: Path) -> None:
    bad = {n for n in _dotted_imports(path) - PURE_ALLOWED if n.split(".")[0] in IO_MODULES}
    assert not bad, f"{path.relative_to(REPO)} is pure logic but imports {sorted(bad)}"
