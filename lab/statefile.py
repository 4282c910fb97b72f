"""The lab's state files: written whole and atomically, updated under a lock.

Several `tabbyctl lab ...` processes may update the same file at once (pods
created from two shells); each must re-read under the lock and change only its
own part, and a reader must never see half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """An exclusive flock on lock_path (released when the process dies, too)."""
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def atomic_write(path: Path, text: str) -> None:
    """Write a temp file in the same directory, fsync it, rename it over path."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
