"""The documented RBAC set: the table in docs/deploy.md, parsed once for every test.

Rows between ``<!-- rbac-table`` and ``<!-- /rbac-table -->``:
``| account | resource | verbs | why |``, resources named as ``kubectl auth can-i
--list`` names them (``pods``, ``ipamblocks.crd.tabby.dev``).
"""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
ACCOUNTS = ("tabby-node", "tabby-controllers")


def documented_grants(doc: Path = DOC) -> dict[str, set[tuple[str, str]]]:
    """account -> {(verb, resource)} from the doc's table."""
    text = doc.read_text()
    start = text.index("<!-- rbac-table")
    end = text.index("<!-- /rbac-table -->", start)
    grants: dict[str, set[tuple[str, str]]] = {account: set() for account in ACCOUNTS}
    for line in text[start:end].splitlines()[1:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] not in grants:
            continue  # the header and the separator row
        account, resource, verbs = cells[:3]
        grants[account] |= {(verb, resource) for verb in verbs.split()}
    assert all(grants.values()), f"no rows for some account in {doc}"
    return grants
