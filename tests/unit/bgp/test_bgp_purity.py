"""bgp/'s compute half stays pure: no I/O module imported (the apply half is separate)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BGP = Path(__file__).resolve().parents[3] / "bgp"
PURE = ["annotations.py", "nodes.py", "config.py", "messages.py", "routes.py", "rib.py"]
PURE_MODULES = {f"bgp.{name[:-3]}" for name in PURE} | {
    "datastore.models",
    "ipam.selector",
}
IO_ROOTS = {
    "subprocess", "socket", "http", "urllib", "requests", "kubernetes", "pyroute2", "exabgp",
    "datastore", "felix", "lab", "bgp", "cni", "tabbyctl", "asyncio", "threading", "shutil",
    "selectors", "signal", "os",
}  # fmt: skip


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "bgp":
            names |= {f"bgp.{alias.name}" for alias in node.names}  # from bgp import x
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("name", PURE)
def test_compute_modules_import_no_io(name: str) -> None:
    found = imports(BGP / name)
    bad = {n for n in found - PURE_MODULES if n.split(".")[0] in IO_ROOTS}
    assert not bad, f"bgp/{name} is pure but imports {sorted(bad)}"


def test_api_helper_uses_only_the_standard_library() -> None:
    """ExaBGP runs the relay with its own interpreter: it must not need Tabby's packages."""
    roots = {n.split(".")[0] for n in imports(BGP / "api_helper.py")}
    assert roots <= {"__future__", "os", "select", "selectors", "socket", "sys", "time"}
