"""datastore.timestamps: the one format Tabby writes and reads in its objects' times."""

from __future__ import annotations

import time

from datastore.timestamps import age_seconds, now_iso


def test_now_round_trips_to_an_age_of_about_zero() -> None:
    stamp = now_iso()
    assert stamp.endswith("Z") and len(stamp) == len("2026-12-06T21:00:00Z")
    age = age_seconds(stamp, time.time())
    assert age is not None and 0 <= age < 2


def test_an_age_is_counted_from_the_stamp_and_garbage_has_none() -> None:
    assert age_seconds("2026-12-06T21:00:00Z", 1796590800.0 + 90) == 90
    for bad in ("", "yesterday", "2026-12-06 21:00:00"):
        assert age_seconds(bad, 0.0) is None
