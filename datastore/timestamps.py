"""Kubernetes timestamps (``metav1.Time``: RFC 3339 in UTC, whole seconds) as Tabby
writes and reads them in its objects."""

from __future__ import annotations

from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def now_iso() -> str:
    """Now, as an object's timestamp field holds it."""
    return datetime.now(UTC).strftime(FORMAT)


def age_seconds(stamp: str, now_s: float) -> float | None:
    """Seconds from ``stamp`` to ``now_s`` (a Unix time); None if it is not a timestamp."""
    try:
        then = datetime.strptime(stamp, FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None
    return now_s - then.timestamp()
