"""Typed access to Tabby's resources and the core objects it reads.

Every write is explicit about concurrency: `update` is a compare-and-swap on the
object's resourceVersion, and `mutate` wraps it in a bounded read-modify-write loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from datastore import kinds
from datastore.errors import Conflict, NotFound
from datastore.models import Resource
from datastore.transport import METADATA_LIST, HttpTransport, Query, Transport

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Resource)
Body = dict[str, Any]

DEFAULT_CAS_RETRIES = 20
LIST_PAGE_SIZE = 500  # objects per list page (client-go's pager uses 500 too)


class RetriesExhausted(Conflict):
    """A compare-and-swap kept losing; the message names the object."""


class Datastore:
    """Reads and writes through one Transport; raw dicts for core kinds, models for ours."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    @classmethod
    def from_kubeconfig(cls, path: str) -> Datastore:
        return cls(HttpTransport.from_kubeconfig(path))

    @classmethod
    def in_cluster(
        cls, directory: Path | None = None, environ: Mapping[str, str] | None = None
    ) -> Datastore:
        """As the pod's ServiceAccount (see HttpTransport.in_cluster)."""
        return cls(HttpTransport.in_cluster(directory, environ))

    @classmethod
    def connect(cls, kubeconfig: str | None) -> Datastore:
        """A kubeconfig's cluster, or in-cluster for None (incluster.choose_kubeconfig's answer)."""
        return cls.from_kubeconfig(kubeconfig) if kubeconfig else cls.in_cluster()

    # -- raw access, any kind ------------------------------------------------------------
    def get_raw(self, kind: kinds.ResourceKind, name: str, namespace: str | None = None) -> Body:
        return self.transport.request("GET", kind.object_path(name, namespace))

    def list_raw(
        self,
        kind: kinds.ResourceKind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Body], str]:
        """All objects of a kind, and the list's resourceVersion (to start a watch from)."""
        query: Query = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        body = self.transport.request("GET", kind.collection_path(namespace), query=query)
        items: list[Body] = body.get("items") or []
        return items, str(body.get("metadata", {}).get("resourceVersion", ""))

    def list_pages(
        self,
        kind: kinds.ResourceKind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = LIST_PAGE_SIZE,
    ) -> Iterator[tuple[list[Body], str]]:
        """The objects of a kind a page at a time (``limit`` and ``continue``, as
        client-go's pager), each page with the list's resourceVersion: a reader that
        keeps only part of each object never holds the whole list at once. All pages
        come from one snapshot; an expired continue token raises Gone (relist)."""
        query: Query = {"limit": page_size}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        while True:
            body = self.transport.request("GET", kind.collection_path(namespace), query=query)
            meta = body.get("metadata") or {}
            yield body.get("items") or [], str(meta.get("resourceVersion", ""))
            token = meta.get("continue")
            if not token:
                return
            query = {**query, "continue": token}

    def list_names(self, kind: kinds.ResourceKind) -> list[str]:
        """Names of every object of a kind, from a metadata-only list (cheap at any size)."""
        body = self.transport.request("GET", kind.collection_path(), accept=METADATA_LIST)
        return [item["metadata"]["name"] for item in body.get("items") or []]

    def create_raw(self, kind: kinds.ResourceKind, body: Body) -> Body:
        namespace = body.get("metadata", {}).get("namespace")
        return self.transport.request("POST", kind.collection_path(namespace), body=body)

    def replace_raw(self, kind: kinds.ResourceKind, body: Body) -> Body:
        """PUT the object; a compare-and-swap when metadata.resourceVersion is set."""
        meta = body["metadata"]
        path = kind.object_path(meta["name"], meta.get("namespace"))
        return self.transport.request("PUT", path, body=body)

    def patch_raw(
        self, kind: kinds.ResourceKind, name: str, patch: Body, namespace: str | None = None
    ) -> Body:
        """A JSON merge patch (no concurrency check: for annotations and labels)."""
        return self.transport.request(
            "PATCH",
            kind.object_path(name, namespace),
            body=patch,
            content_type="application/merge-patch+json",
        )

    def delete_raw(
        self,
        kind: kinds.ResourceKind,
        name: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        uid: str | None = None,
    ) -> None:
        """Delete, optionally only if the object is still at resource_version / uid."""
        preconditions: dict[str, str] = {}
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        if uid:
            preconditions["uid"] = uid
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions:
            body["preconditions"] = preconditions  # type: ignore[assignment]
        self.transport.request("DELETE", kind.object_path(name, namespace), body=body)

    # -- typed access, Tabby's custom resources -----------------------------------------
    def get(self, cls: type[R], name: str) -> R:
        return cls.from_wire(self.get_raw(cls.KIND, name))

    def try_get(self, cls: type[R], name: str) -> R | None:
        try:
            return self.get(cls, name)
        except NotFound:
            return None

    def list(self, cls: type[R], *, label_selector: str | None = None) -> list[R]:
        items, _ = self.list_raw(cls.KIND, label_selector=label_selector)
        return [cls.from_wire(item) for item in items]

    def create(self, obj: R) -> R:
        body = obj.to_wire()
        body["metadata"].pop("resourceVersion", None)
        return type(obj).from_wire(self.create_raw(obj.KIND, body))

    def update(self, obj: R) -> R:
        """Compare-and-swap: raises Conflict if the object changed since obj was read."""
        if not obj.metadata.resource_version:
            raise ValueError(f"update of {obj.KIND.kind} {obj.name} needs a resourceVersion")
        return type(obj).from_wire(self.replace_raw(obj.KIND, obj.to_wire()))

    def delete(self, obj: Resource, *, check_version: bool = True) -> None:
        """Delete obj; with check_version, only if nobody changed it since it was read."""
        self.delete_raw(
            obj.KIND,
            obj.name,
            resource_version=obj.metadata.resource_version if check_version else None,
            uid=obj.metadata.uid if check_version else None,
        )

    def mutate(
        self,
        cls: type[R],
        name: str,
        change: Callable[[R], R | None],
        *,
        retries: int = DEFAULT_CAS_RETRIES,
    ) -> R | None:
        """Read, apply `change`, write back with CAS; re-read and retry on conflict.

        `change` gets a fresh copy each attempt and returns the new object, or None
        to leave it as it is (then the current object is returned).
        """
        for attempt in range(retries):
            current = self.get(cls, name)
            wanted = change(current.model_copy(deep=True))
            if wanted is None:
                return current
            try:
                return self.update(wanted)
            except Conflict:
                log.debug("CAS conflict on %s %s (attempt %d)", cls.KIND.kind, name, attempt + 1)
                time.sleep(min(0.002 * 2**attempt, 0.1))
        raise RetriesExhausted(
            f"{cls.KIND.kind} {name}: still conflicting after {retries} compare-and-swap attempts"
        )
