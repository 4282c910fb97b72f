"""The one exception the policy package raises for bad input.

The agent logs or events a ``PolicyError`` and skips the object; any other
exception escaping the parsers would be a bug, so the parsers check every
field's type before they use it.
"""

from __future__ import annotations


class PolicyError(ValueError):
    """An API object (policy, pod, namespace) that cannot be compiled.

    ``str(err)`` names the object and the field path, e.g.
    ``networkpolicy default/web: spec.ingress[0].ports[1].port: 0 is out of range``,
    so a person can fix the manifest without reading code.
    """

    def __init__(self, message: str, *, obj: str = "", path: str = "") -> None:
        self.obj = obj
        self.path = path
        self.detail = message
        parts = [p for p in (obj, path) if p]
        super().__init__(": ".join([*parts, message]))
