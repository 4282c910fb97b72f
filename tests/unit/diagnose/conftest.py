"""An in-memory datastore for the diagnose walk's unit tests (no apiserver)."""

from __future__ import annotations

import pytest

from datastore.client import Datastore
from datastore.memory import MemoryTransport


@pytest.fixture
def ds() -> Datastore:
    return Datastore(MemoryTransport())
