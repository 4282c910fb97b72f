"""The documented RBAC set: the table in docs/deploy.md, parsed once for every test.

Rows between ``<!-- rbac-table`` and ``<!-- /rbac-table -->``:
``| account | resource | verbs | why | ... |``, resources named as ``kubectl auth can-i
--list`` names them (``pods``, ``ipamblocks.crd.tabby.dev``). A grant of a Role on
named objects of one namespace reads ``secrets named tabby-bgp-passwords in kube-system``
and is shown, as can-i shows it there, as ``secrets[tabby-bgp-passwords]``.
"""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
ACCOUNTS = ("tabby-node", "tabby-controllers")
NAMED = re.compile(r"(?P<resource>\S+) named (?P<name>\S+) in (?P<namespace>\S+)")


def _rows(doc: Path) -> list[tuple[str, str, list[str]]]:
    text = doc.read_text()
    start = text.index("<!-- rbac-table")
    end = text.index("<!-- /rbac-table -->", start)
    rows = []
    for line in text[start:end].splitlines()[1:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] not in ACCOUNTS:
            continue  # the header and the separator row
        rows.append((cells[0], cells[1], cells[2].split()))
    return rows


def documented_grants(
    namespace: str | None = None, doc: Path = DOC
) -> dict[str, set[tuple[str, str]]]:
    """account -> {(verb, resource)} from the doc's table: the cluster-wide rows, and in
    *namespace* also the named rows of that namespace (as ``resource[name]``)."""
    grants: dict[str, set[tuple[str, str]]] = {account: set() for account in ACCOUNTS}
    for account, written, verbs in _rows(doc):
        named = NAMED.fullmatch(written)
        resource = written
        if named is not None:
            if named["namespace"] != namespace:
                continue
            resource = f"{named['resource']}[{named['name']}]"
        grants[account] |= {(verb, resource) for verb in verbs}
    assert all(grants.values()), f"no rows for some account in {doc}"
    return grants


def documented_named_grants(doc: Path = DOC) -> dict[str, dict[tuple[str, str, str], set[str]]]:
    """account -> {(namespace, resource, name): verbs}: the rows a Role grants."""
    out: dict[str, dict[tuple[str, str, str], set[str]]] = {}
    for account, resource, verbs in _rows(doc):
        named = NAMED.fullmatch(resource)
        if named is not None:
            key = (named["namespace"], named["resource"], named["name"])
            out.setdefault(account, {}).setdefault(key, set()).update(verbs)
    return out
