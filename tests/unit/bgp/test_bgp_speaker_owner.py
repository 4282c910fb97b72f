"""Which process a speaker pidfile may stop (issue 21 item 2): identity, never a name.

The real orphan and takeover are in tests/integration/agent/test_agent_bgp_takeover.py;
here the checks run against this test process's own /proc entry and made-up records.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from bgp.speaker import (
    SpeakerOptions,
    is_our_speaker,
    process_start_time,
    speaker_record,
    stop_orphan,
    with_parent_death,
)


def test_a_record_matches_only_the_same_process_with_our_config(tmp_path: Path) -> None:
    # PID 1 (init) stands in for "a live process that is not ours"
    config = tmp_path / "exabgp.conf"
    record = speaker_record(1, config)
    assert record is not None and record["pid"] == 1
    assert not is_our_speaker(record, config)  # pid 1 is never ours
    started = process_start_time(os.getpid())
    assert started is not None
    mine = {**record, "pid": os.getpid(), "startTime": started}
    assert not is_our_speaker(mine, config)  # nor the agent itself


def test_mismatches_are_not_ours(tmp_path: Path) -> None:
    config = tmp_path / "exabgp.conf"
    base = speaker_record(1, config)
    assert base is not None
    for bad in (
        {**base, "startTime": base["startTime"] + 1},  # a reused pid
        {**base, "bootId": "another-boot"},
        {**base, "config": str(tmp_path / "other.conf")},
        {**base, "pid": "x"},
        {"pid": 1},
        {},
    ):
        assert not is_our_speaker(bad, config), bad


def test_a_pidfile_naming_another_process_is_removed_and_nothing_signalled(
    tmp_path: Path,
) -> None:
    options = SpeakerOptions(workdir=tmp_path)
    record = speaker_record(1, options.config_file)
    options.pid_file.write_text(json.dumps(record))
    assert stop_orphan(options) is None
    assert not options.pid_file.exists()
    options.pid_file.write_text("not json")
    assert stop_orphan(options) is None
    assert not options.pid_file.exists()
    assert stop_orphan(options) is None  # no pidfile: nothing to do


def test_parent_death_wraps_the_command_and_keeps_it_last() -> None:
    argv = ["ip", "netns", "exec", "ns", "exabgp", "server", "/run/x.conf"]
    wrapped = with_parent_death(argv, signal.SIGTERM, "/usr/bin/python3")
    assert wrapped[:3] == ["/usr/bin/python3", "-S", "-c"]
    assert wrapped[4:6] == [str(int(signal.SIGTERM)), str(os.getpid())]
    assert wrapped[6:] == argv
    assert with_parent_death(argv, None, "/usr/bin/python3") == argv
