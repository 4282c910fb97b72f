"""ExaBGP accepts our rendered configs; BIRD 2 as an external (ToR-like) eBGP peer."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bgp.config import compute_plan, render_exabgp_config
from bgp.speaker import HELPER
from datastore.models import BGPConfiguration, BGPPeer
from tests.helpers import wait_for
from tests.integration.bgp.bgp_netns import Lab, daemon
from tests.integration.bgp.test_bgp_exabgp import node, start_agent

pytestmark = pytest.mark.integration

EXABGP = str(Path(sys.executable).with_name("exabgp"))


def test_exabgp_validates_rendered_configs(tmp_path: Path) -> None:
    """`exabgp validate` (research notes 1.1) on a mesh + reflector + external peers config."""
    if not os.path.exists(EXABGP):
        pytest.skip("exabgp is not installed in this venv")
    nodes = [
        node("a", "10.99.0.1/24"),
        node("b", "10.99.0.2/24", **{"tabby.dev/as-number": "64600"}),
        node("rr", "10.99.0.3/24", **{"tabby.dev/route-reflector-cluster-id": "244.0.0.1"}),
    ]
    peers = [
        BGPPeer.model_validate(
            {"metadata": {"name": "tor"}, "spec": {"peerIP": "10.99.0.5:1179", "asNumber": 64513}}
        )
    ]
    cfg = BGPConfiguration.model_validate({"metadata": {"name": "default"}})
    for me in ("a", "rr"):
        plan = compute_plan(cfg, nodes, peers, me)
        assert plan is not None
        conf = tmp_path / f"{me}.conf"
        conf.write_text(
            render_exabgp_config(plan, [sys.executable, str(HELPER), str(tmp_path / "s")])
        )
        result = _validate(conf)
        assert result.returncode == 0, result.stdout + result.stderr
    # and the check has teeth: a broken file is refused
    broken = tmp_path / "broken.conf"
    broken.write_text(conf.read_text().replace("hold-time", "bogus-option"))
    assert _validate(broken).returncode != 0


def _validate(conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXABGP, "validate", str(conf)], check=False, capture_output=True, text=True, timeout=60
    )


BIRD_CONF = """\
router id 10.99.0.5;
protocol device {{}}
protocol direct {{ ipv4; interface "eth0"; }}
protocol kernel {{ ipv4 {{ import none; export filter {{ if proto = "tabby_a" then accept; reject; }}; }}; }}
protocol static tor_routes {{ ipv4; route 172.16.0.0/16 blackhole; }}
protocol bgp tabby_a {{
  local 10.99.0.5 as 64513;
  neighbor 10.99.0.1 as 64512;
  hold time 30;
  ipv4 {{ import all; export where proto = "tor_routes"; }};
}}
"""  # noqa: E501


def test_bird_as_external_peer(lab: Lab, tmp_path: Path) -> None:
    if shutil.which("bird") is None:
        pytest.skip("bird2 is not installed")
    lab.add_node("a", 1)
    tor_ns = lab.add_node("tor", 5)
    conf = tmp_path / "bird.conf"
    conf.write_text(BIRD_CONF.format())
    bird = subprocess.Popen(
        ["ip", "netns", "exec", tor_ns, "bird", "-f", "-c", str(conf), "-s",
         str(tmp_path / "bird.ctl"), "-P", str(tmp_path / "bird.pid")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        tor = BGPPeer.model_validate(
            {"metadata": {"name": "tor"}, "spec": {"peerIP": "10.99.0.5", "asNumber": 64513}}
        )
        a = start_agent(
            lab, tmp_path, "a", nodes=[node("a", "10.99.0.1/24")], blocks=["10.244.1.0/26"],
            peers=[tor],
        )  # fmt: skip
        wait_for(
            lambda: "172.16.0.0/16 via 10.99.0.5 proto 81" in a.kernel(), what="ToR route at a"
        )
        wait_for(
            lambda: "10.244.1.0/26 via 10.99.0.1 dev eth0 proto bird" in lab.routes(tor_ns),
            what="a's block in BIRD's kernel",
        )
        status = a.speaker.status_document()["peers"]
        assert [(p["address"], p["type"], p["state"]) for p in status] == [
            ("10.99.0.5", "global", "up")
        ]
        learned = a.speaker.learned_routes()
        assert [(str(r.prefix), r.as_path) for r in learned] == [("172.16.0.0/16", (64513,))]
        assert learned[0].next_hop == ipaddress.IPv4Address("10.99.0.5")

        # BIRD goes away: its route leaves a's kernel (ExaBGP reports only `down`)
        os.killpg(bird.pid, signal.SIGTERM)
        bird.wait(timeout=10)
        wait_for(lambda: not any("172.16" in r for r in a.kernel()), what="ToR route dropped")
    finally:
        if bird.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(bird.pid, signal.SIGKILL)
            bird.wait(timeout=10)


BIRD_ECHO_CONF = """\
router id 10.99.0.5;
protocol device {}
protocol direct { ipv4; interface "eth0"; }
template bgp tabby { local 10.99.0.5 as 64513; hold time 30; ipv4 { import all; export all; }; }
protocol bgp tabby_a from tabby { neighbor 10.99.0.1 as 64512; }
protocol bgp tabby_b from tabby { neighbor 10.99.0.2 as 64512; }
"""


def test_blocks_echoed_back_through_an_external_peer_are_ignored(lab: Lab, tmp_path: Path) -> None:
    """BIRD exports everything it learns: a's block comes back to b as AS path 64513 64512."""
    if shutil.which("bird") is None:
        pytest.skip("bird2 is not installed")
    lab.add_node("a", 1)
    lab.add_node("b", 2)
    tor_ns = lab.add_node("tor", 5)
    conf = tmp_path / "bird.conf"
    conf.write_text(BIRD_ECHO_CONF)
    argv = ["bird", "-f", "-c", str(conf), "-s", str(tmp_path / "ctl"), "-P", str(tmp_path / "pid")]
    with daemon(tor_ns, argv):
        tor = BGPPeer.model_validate(
            {"metadata": {"name": "tor"}, "spec": {"peerIP": "10.99.0.5", "asNumber": 64513}}
        )
        nodes = [node("a", "10.99.0.1/24"), node("b", "10.99.0.2/24")]
        a = start_agent(lab, tmp_path, "a", nodes=nodes, blocks=["10.244.1.0/26"], peers=[tor])
        b = start_agent(lab, tmp_path, "b", nodes=nodes, blocks=["10.244.2.0/26"], peers=[tor])
        # both nodes' echoes arrive and are dropped (our AS is in their AS path)
        wait_for(lambda: a.speaker.core.dropped > 0 and b.speaker.core.dropped > 0, what="echoes")
        wait_for(lambda: "10.244.1.0/26 via 10.99.0.1 proto 81" in b.kernel(), what="a at b")
        wait_for(lambda: "10.244.2.0/26 via 10.99.0.2 proto 81" in a.kernel(), what="b at a")
        learned_at_b = [r for r in b.speaker.learned_routes() if str(r.prefix) == "10.244.1.0/26"]
        assert [(str(r.peer), r.as_path) for r in learned_at_b] == [("10.99.0.1", ())]
        assert not any("via 10.99.0.5" in r for r in a.kernel() | b.kernel())
