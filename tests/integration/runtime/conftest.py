"""Fixtures for tests that drive a real containerd over CRI inside a lab node."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.controlplane import k8s_bin_dir
from lab.runtime import Containerd, build_pause_image
from lab.topology import Lab

REFERENCE_PLUGINS = Path("/usr/lib/cni")


@pytest.fixture(scope="session")
def pause_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_pause_image(k8s_bin_dir() / "pause", tmp_path_factory.mktemp("images"))


def reference_conflist(name: str, subnet: str, data_dir: Path) -> dict[str, object]:
    """Debian's ptp + host-local: the yardstick Tabby is compared with."""
    return {
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": False,
                "mtu": 1500,
                "ipam": {
                    "type": "host-local",
                    "subnet": subnet,
                    "dataDir": str(data_dir),
                },
            },
        ],
    }


@pytest.fixture
def node_with_containerd(
    tmp_path: Path, pause_archive: Path
) -> Iterator[tuple[Lab, Containerd, Path]]:
    """A one-node lab running containerd; the test writes the conflist into conf_dir."""
    lab = Lab.create(nodes=1)
    bin_dir, conf_dir = tmp_path / "cni-bin", tmp_path / "cni-conf"
    bin_dir.mkdir()
    conf_dir.mkdir()
    for plugin in ("loopback", "ptp", "host-local", "portmap", "bandwidth"):
        shutil.copy2(REFERENCE_PLUGINS / plugin, bin_dir / plugin)
    runtime = Containerd(
        lab,
        lab.node("node1"),
        tmp_path / "containerd",
        cni_bin_dir=bin_dir,
        cni_conf_dir=conf_dir,
        crictl=k8s_bin_dir() / "crictl",
    )
    try:
        yield lab, runtime, conf_dir
    finally:
        runtime.stop()
        lab.teardown()


def write_conflist(conf_dir: Path, conflist: dict[str, object]) -> None:
    (conf_dir / "10-test.conflist").write_text(json.dumps(conflist))
