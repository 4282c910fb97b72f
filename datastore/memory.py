"""An in-memory apiserver behind the Transport seam, for pure-logic tests.

It keeps the semantics Tabby relies on: a global resourceVersion counter,
compare-and-swap on PUT, delete preconditions, AlreadyExists on create, and hooks
to inject faults (a conflict or an outage before a chosen request). It does not
validate schemas or serve watches: those are tested against the real apiserver.
"""

from __future__ import annotations

import copy
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from datastore.errors import AlreadyExists, Conflict, NotFound
from datastore.transport import METADATA_LIST, Query

Key = tuple[str, str, str]  # (group/version/plural, namespace, name)
FaultHook = Callable[[str, str], None]


def _parse(path: str) -> tuple[str, str, str | None]:
    """('/apis/g/v/ns/x/plural/name') -> (collection, namespace, name)."""
    parts = path.strip("/").split("/")
    head = parts[:3] if parts[0] == "apis" else parts[:2]
    rest = parts[len(head) :]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    collection = "/".join([*head, rest[0]])
    name = rest[1] if len(rest) > 1 else None
    return collection, namespace, name


class MemoryTransport:
    """A Transport that stores objects in a dict, thread-safe."""

    def __init__(self) -> None:
        self._objects: dict[Key, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._versions = itertools.count(1)
        self.fault_hook: FaultHook | None = None
        self.requests = 0

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        if self.fault_hook:
            self.fault_hook(method, path)
        collection, namespace, name = _parse(path)
        with self._lock:
            self.requests += 1
            if method == "GET" and name is None:
                listed = self._list(collection, namespace)
                if accept == METADATA_LIST:
                    listed["items"] = [{"metadata": i["metadata"]} for i in listed["items"]]
                return listed
            if method == "GET":
                return copy.deepcopy(self._get(collection, namespace, name or ""))
            if method == "POST":
                return self._create(collection, namespace, body)
            if method == "PUT":
                return self._replace(collection, namespace, name or "", body)
            if method == "PATCH":
                return self._patch(collection, namespace, name or "", body)
            if method == "DELETE":
                return self._delete(collection, namespace, name or "", body or {})
        raise ValueError(f"unsupported method {method}")

    def watch(self, path: str, query: Query, timeout: float) -> Iterator[dict[str, Any]]:
        raise NotImplementedError("MemoryTransport does not serve watches")

    # -- internals (called with the lock held) ------------------------------------------
    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(obj)

    def _get(self, collection: str, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self._objects[(collection, namespace, name)]
        except KeyError:
            raise NotFound(f'{collection} "{name}" not found', 404, "NotFound") from None

    def _list(self, collection: str, namespace: str) -> dict[str, Any]:
        items = [
            copy.deepcopy(obj)
            for (coll, ns, _), obj in sorted(self._objects.items())
            if coll == collection and (not namespace or ns == namespace)
        ]
        version = str(next(self._versions))
        return {"items": items, "metadata": {"resourceVersion": version}}

    def _create(self, collection: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        name = obj["metadata"]["name"]
        key = (collection, namespace or obj["metadata"].get("namespace", ""), name)
        if key in self._objects:
            raise AlreadyExists(f'{collection} "{name}" already exists', 409, "AlreadyExists")
        obj["metadata"]["uid"] = str(uuid.uuid4())
        self._objects[key] = obj
        return self._bump(obj)

    def _replace(
        self, collection: str, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        current = self._get(collection, namespace, name)
        wanted_version = body["metadata"].get("resourceVersion")
        if wanted_version and wanted_version != current["metadata"]["resourceVersion"]:
            raise Conflict(
                f'Operation cannot be fulfilled on {collection} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                409,
                "Conflict",
            )
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = current["metadata"]["uid"]
        self._objects[(collection, namespace, name)] = obj
        return self._bump(obj)

    def _patch(
        self, collection: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        current = self._get(collection, namespace, name)
        _merge(current, patch)
        return self._bump(current)

    def _delete(
        self, collection: str, namespace: str, name: str, options: dict[str, Any]
    ) -> dict[str, Any]:
        current = self._get(collection, namespace, name)
        pre = options.get("preconditions") or {}
        meta = current["metadata"]
        if any(pre.get(k) and pre[k] != meta.get(k) for k in ("resourceVersion", "uid")):
            raise Conflict(f'precondition failed deleting {collection} "{name}"', 409, "Conflict")
        del self._objects[(collection, namespace, name)]
        return {"status": "Success"}


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
