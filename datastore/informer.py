"""List+watch informers: a consistent local cache of one kind, with callbacks.

The loop lists once, then watches from the list's resourceVersion. A watch that ends
(server timeout, apiserver restart, network error) is resumed from the last
resourceVersion seen, with exponential backoff while the apiserver is away. If that
version has expired (410 Gone), the informer relists and reconciles the new list
against its cache, so callbacks see each real change exactly once: adds for new
objects, updates for changed ones, deletes for ones that vanished meanwhile.

An *optional* kind (a CRD a cluster may not have installed, such as
ClusterNetworkPolicy) that a ready apiserver does not serve (404 on the list or watch,
and ``/readyz`` answers) counts as synced and empty: its objects, if any were cached,
are deleted, and the list is tried again every ``absent_retry_s`` until the kind is
served; then its objects are added as any list's are. A 404 from an apiserver that is
not ready (it serves custom resources only once its CRD informer has synced) is
retried with backoff, as is a required kind's: reading a Deny policy's kind as empty
for a moment would open what it denies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from datastore import kinds
from datastore.client import LIST_PAGE_SIZE, Datastore
from datastore.errors import DatastoreError, Gone, NotFound
from datastore.transport import Query

log = logging.getLogger(__name__)

ABSENT_RETRY_S = 10.0  # how often an optional kind that is not served is looked for
Obj = dict[str, Any]
Handler = Callable[[Obj], None]
UpdateHandler = Callable[[Obj, Obj], None]


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def _version(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


def without_managed_fields(obj: Obj) -> Obj:
    """``obj`` without ``metadata.managedFields`` (server-side apply's bookkeeping,
    often the largest part of an object, read by nobody in Tabby)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


@dataclass
class InformerStats:
    """Counters for tests, metrics and `tabbyctl` diagnostics."""

    lists: int = 0
    watches: int = 0
    relists_on_gone: int = 0
    errors: int = 0
    events: int = 0


@dataclass
class Handlers:
    on_add: Handler | None = None
    on_update: UpdateHandler | None = None
    on_delete: Handler | None = None


@dataclass
class Backoff:
    """Exponential backoff with a cap; reset after a successful watch event."""

    initial: float = 0.2
    cap: float = 10.0
    current: float = field(default=0.0, init=False)

    def next(self) -> float:
        self.current = min(self.cap, self.current * 2 if self.current else self.initial)
        return self.current

    def reset(self) -> None:
        self.current = 0.0


class Informer:
    """Keeps `cache` equal to the apiserver's view of one kind, in a background thread."""

    def __init__(
        self,
        datastore: Datastore,
        kind: kinds.ResourceKind,
        handlers: Handlers | None = None,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout_s: int = 240,
        resource_version: str | None = None,
        backoff: Backoff | None = None,
        transform: Callable[[Obj], Obj] | None = None,
        page_size: int = LIST_PAGE_SIZE,
        optional: bool = False,
        absent_retry_s: float = ABSENT_RETRY_S,
    ) -> None:
        """``transform`` (client-go's SetTransform) shapes each object before it is
        cached and handed to the handlers: an agent keeps only the fields it reads."""
        self.datastore = datastore
        self.kind = kind
        self.handlers = handlers or Handlers()
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout_s = watch_timeout_s
        self.resource_version = resource_version or ""
        self.backoff = backoff or Backoff()
        self.transform = transform
        self.page_size = page_size
        self.optional = optional
        self.absent_retry_s = absent_retry_s
        self.served = True  # False while an optional kind is not served (no CRD)
        self.cache: dict[str, Obj] = {}
        self.stats = InformerStats()
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._needs_list = not self.resource_version

    # -- public -------------------------------------------------------------------------
    def start(self) -> Informer:
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{self.kind.plural}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self.synced.wait(timeout)

    def get(self, key: str) -> Obj | None:
        """One cached object by its key (``namespace/name``, or ``name``)."""
        with self._lock:
            return self.cache.get(key)

    def snapshot(self) -> dict[str, Obj]:
        with self._lock:
            return dict(self.cache)

    # -- loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._needs_list:
                    self._list_and_reconcile()
                self._watch_once()
            except NotFound as exc:
                if not (self.optional and self._apiserver_ready()):
                    self._retry_after_error(exc)
                    continue
                self._absent(exc)
                self._stop.wait(self.absent_retry_s)
            except Gone:
                self.stats.relists_on_gone += 1
                log.info(
                    "%s: resourceVersion %s expired; relisting",
                    self.kind.plural,
                    self.resource_version,
                )
                self._needs_list = True
            except DatastoreError as exc:
                self._retry_after_error(exc)

    def _retry_after_error(self, exc: DatastoreError) -> None:
        self.stats.errors += 1
        delay = self.backoff.next()
        log.warning("%s watch failed (%s); retrying in %.1fs", self.kind.plural, exc, delay)
        self._stop.wait(delay)

    def _apiserver_ready(self) -> bool:
        """Whether the apiserver says it is ready: then its 404 for a kind is the truth."""
        try:
            self.datastore.transport.request("GET", "/readyz", timeout=5)
        except DatastoreError:
            return False
        return True

    def _absent(self, exc: NotFound) -> None:
        """The optional kind is not served: an empty, synced cache; relist later."""
        if self.served:
            log.warning(
                "%s is not served by the apiserver (%s; is its CRD installed?): treated "
                "as none, looked for again every %.0fs",
                self.kind.plural, exc, self.absent_retry_s,
            )  # fmt: skip
        self.served = False
        with self._lock:
            gone, self.cache = self.cache, {}
        for item in gone.values():
            self._emit_delete(item)
        self.resource_version = ""
        self._needs_list = True
        self.synced.set()

    def _query(self) -> Query:
        query: Query = {}
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        return query

    def _list_and_reconcile(self) -> None:
        fresh: dict[str, Obj] = {}
        version = ""
        pages = self.datastore.list_pages(
            self.kind,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            page_size=self.page_size,
        )
        for items, page_version in pages:  # shaped a page at a time, not the whole list
            version = page_version  # every page carries the snapshot's version
            for item in items:
                shaped = self.transform(item) if self.transform is not None else item
                fresh[object_key(shaped)] = shaped
        self.stats.lists += 1
        with self._lock:
            old = self.cache
            self.cache = fresh
        for key, item in fresh.items():
            if key not in old:
                self._emit_add(item)
            elif _version(old[key]) != _version(item):
                self._emit_update(old[key], item)
        for key, item in old.items():
            if key not in fresh:
                self._emit_delete(item)
        self.resource_version = version
        self._needs_list = False
        if not self.served:
            log.info("%s is served now: %d listed", self.kind.plural, len(fresh))
        self.served = True
        self.backoff.reset()
        self.synced.set()

    def _watch_once(self) -> None:
        query = {
            **self._query(),
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": self.watch_timeout_s,
        }
        self.stats.watches += 1
        stream = self.datastore.transport.watch(
            self.kind.collection_path(self.namespace), query, timeout=self.watch_timeout_s + 30
        )
        for event in stream:
            if self._stop.is_set():
                return
            self._handle(event)
            self.backoff.reset()

    def _handle(self, event: Obj) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code", 0))
            message = str(obj.get("message", "watch error"))
            if code == 410:
                raise Gone(message, 410, "Expired")
            raise DatastoreError(message, code)
        version = _version(obj)
        if kind == "BOOKMARK":
            self.resource_version = version or self.resource_version
            return
        self.stats.events += 1
        if self.transform is not None:
            obj = self.transform(obj)
        key = object_key(obj)
        with self._lock:
            old = self.cache.get(key)
            if kind == "DELETED":
                self.cache.pop(key, None)
            else:
                self.cache[key] = obj
        self.resource_version = version or self.resource_version
        if kind == "DELETED":
            self._emit_delete(obj)
        elif old is None:
            self._emit_add(obj)
        else:
            self._emit_update(old, obj)

    # -- callbacks never kill the loop --------------------------------------------------
    def _emit_add(self, obj: Obj) -> None:
        if self.handlers.on_add:
            self._safely(self.handlers.on_add, obj)

    def _emit_update(self, old: Obj, new: Obj) -> None:
        if self.handlers.on_update:
            self._safely(self.handlers.on_update, old, new)

    def _emit_delete(self, obj: Obj) -> None:
        if self.handlers.on_delete:
            self._safely(self.handlers.on_delete, obj)

    def _safely(self, fn: Callable[..., None], *args: Obj) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception(
                "%s informer callback failed for %s", self.kind.plural, object_key(args[-1])
            )
