"""Datastore errors, mapped from apiserver status codes so callers never see HTTP."""

from __future__ import annotations


class DatastoreError(Exception):
    """Any failure talking to the datastore; `status` is the HTTP code when there was one."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class NotFound(DatastoreError):
    """The object does not exist (404)."""


class AlreadyExists(DatastoreError):
    """Create of an object whose name is taken (409 AlreadyExists)."""


class Conflict(DatastoreError):
    """A compare-and-swap lost: the object changed since it was read (409 Conflict)."""


class Invalid(DatastoreError):
    """The apiserver rejected the object's content (422); the message says why."""


class Gone(DatastoreError):
    """A watch or list asked for a resourceVersion that is too old (410)."""


class Unavailable(DatastoreError):
    """The apiserver could not be reached or answered 5xx; worth retrying later."""


class Unauthorized(DatastoreError):
    """The apiserver did not accept the credentials (401): a bad, expired or revoked token."""


class Forbidden(DatastoreError):
    """Authenticated, but RBAC (or an admission policy) refused the request (403)."""


class NotConfigured(DatastoreError):
    """No cluster to talk to: no kubeconfig and no in-cluster ServiceAccount.

    The message names what was looked for, so the person starting the program can fix it.
    """


def error_for(status: int, reason: str, message: str) -> DatastoreError:
    """Pick the error class for an apiserver Status."""
    if status == 401:
        return Unauthorized(message, status, reason)
    if status == 403:
        return Forbidden(message, status, reason)
    if status == 404:
        return NotFound(message, status, reason)
    if status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls(message, status, reason)
    if status == 422:
        return Invalid(message, status, reason)
    if status == 410:
        return Gone(message, status, reason)
    if status == 0 or status >= 500 or status == 429:
        return Unavailable(message, status, reason)
    return DatastoreError(message, status, reason)
