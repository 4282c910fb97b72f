"""The lab's node images, proved inside a real containerd: built with no daemon and no
registry (lab.images), imported with `ctr images import`, found by CRI under the names
the manifests use, and run as containers whose content is what the pods need.

One lab node runs containerd (lab.runtime.Containerd) with Debian's reference CNI
plugins; each test imports the archives, starts a sandbox and containers through
crictl (as kubelet would), and runs commands in them with ExecSync.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from lab.controlplane import k8s_bin_dir
from lab.images import (
    AGNHOST_ALIASES,
    AGNHOST_IMAGE,
    CNI_PLUGIN_DIR,
    NODE_CNI_EXECUTABLES,
    SITE_PACKAGES,
    TABBY_IMAGE,
    VENV,
    ImageBuildError,
    build_agnhost_image,
    build_tabby_image,
    import_images,
)
from lab.runtime import Containerd
from lab.topology import Lab
from tests.integration.runtime.conftest import reference_conflist, write_conflist

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tabby_archive() -> Path:
    return build_tabby_image()


@pytest.fixture(scope="module")
def agnhost_archive() -> Path:
    return build_agnhost_image(k8s_bin_dir())


def _started(node: tuple[Lab, Containerd, Path], pause_archive: Path) -> Containerd:
    _lab, runtime, conf_dir = node
    write_conflist(conf_dir, reference_conflist("ref", "10.98.0.0/24", conf_dir.parent / "ipam"))
    return runtime.start(pause_archive)


def _container(runtime: Containerd, pod: str, name: str, image: str, **spec: object) -> str:
    """CreateContainer + StartContainer in the sandbox `pod` (named `name` in `default`)."""
    config = {
        "metadata": {"name": name},
        "image": {"image": image},
        "log_path": f"{name}.log",
        **spec,
    }
    path = runtime.workdir / f"container-{name}.json"
    path.write_text(json.dumps(config))
    pod_config = runtime.workdir / "pod-default-images.json"
    cid = runtime.crictl("create", "--no-pull", pod, str(path), str(pod_config)).strip()
    runtime.crictl("start", cid)
    return cid


def _exec(runtime: Containerd, cid: str, *argv: str) -> str:
    """ExecSync (over the CRI socket: no streaming server): the command's stdout + stderr."""
    sock = f"unix://{runtime.socket}"
    proc = subprocess.run(
        [str(runtime.crictl_bin), "--runtime-endpoint", sock, "--image-endpoint", sock,
         "exec", "--sync", "--timeout", "60", cid, *argv],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"{argv} in {cid} failed ({proc.returncode}): {proc.stderr}"
    # crictl's own log lines (time="..." level=...) are not the command's output.
    stderr = [
        line for line in proc.stderr.splitlines(keepends=True) if not line.startswith("time=")
    ]
    return proc.stdout + "".join(stderr)


def _repo_tags(runtime: Containerd) -> set[str]:
    images = json.loads(runtime.crictl("images", "-o", "json"))["images"]
    return {tag for image in images for tag in image["repoTags"]}


def _image_config(runtime: Containerd, ref: str) -> dict[str, object]:
    info = json.loads(runtime.crictl("inspecti", ref))
    config: dict[str, object] = info["info"]["imageSpec"]["config"]
    return config


def test_tabby_image_holds_what_the_daemonset_and_controllers_run(
    node_with_containerd: tuple[Lab, Containerd, Path],
    pause_archive: Path,
    tabby_archive: Path,
) -> None:
    runtime = _started(node_with_containerd, pause_archive)
    start = time.monotonic()
    assert import_images(runtime.socket, [tabby_archive]) == [TABBY_IMAGE]
    print(f"\nimport of {tabby_archive.name} ({tabby_archive.stat().st_size / 1e6:.0f} MB):"
          f" {time.monotonic() - start:.1f} s")  # fmt: skip
    # The manifests' short name resolves to the imported image, as kubelet's lookup does.
    assert TABBY_IMAGE in _repo_tags(runtime)
    config = _image_config(runtime, "tabby:0.1.0")
    assert config["Entrypoint"] == ["tabby-node"]
    assert f"PATH={VENV}/bin:" in " ".join(config["Env"])  # type: ignore[arg-type]

    pod = runtime.run_pod_sandbox("images", "default")
    # The agent's container is privileged; NET_ADMIN is what `ipset version` needs (it
    # asks the kernel for its protocol), and the sandbox's netns is the test's own.
    node = _container(
        runtime, pod, "node", "tabby:0.1.0",
        command=["sleep", "infinity"],
        linux={"security_context": {"capabilities": {"add_capabilities": ["NET_ADMIN"]}}},
    )  # fmt: skip
    for argv, expected in [
        (["tabby-node", "--help"], "usage: tabby-node"),
        (["tabbyctl", "--help"], "Usage: tabbyctl"),
        (["exabgp", "version"], "ExaBGP : 5."),
        (["iptables-nft", "--version"], "(nf_tables)"),
        (["iptables-legacy", "--version"], "(legacy)"),
        (["ipset", "version"], "ipset v7"),
        (["ip", "-V"], "iproute2"),
        (["conntrack", "--version"], "conntrack v1"),
        (["modprobe", "--version"], "kmod version"),
        (["python3", "--version"], "Python 3.11"),
    ]:
        assert expected in _exec(runtime, node, *argv), argv
    # The image's own copy of Tabby, its dependencies (python-iptables finds libxtables),
    # and exabgp beside sys.executable, where bgp.speaker looks for it.
    probe = (
        "import sys, pathlib, felix.agent, datastore.transport, iptc, kubernetes.watch, pyroute2;"
        "print(felix.agent.__file__);"
        "print(pathlib.Path(sys.executable).with_name('exabgp').is_file())"
    )
    out = _exec(runtime, node, "python3", "-c", probe).split()
    assert out == [f"{SITE_PACKAGES}/felix/agent.py", "True"]
    # The DaemonSet's start script: /bin/sh with awk and ip; the probe's find.
    script = "ip -o -4 addr show | awk '{print $2; exit}'; find /etc/hostname -mmin +30"
    assert _exec(runtime, node, "/bin/sh", "-c", script).split()[0] == "lo"

    # The install-cni init container's command, as the DaemonSet runs it.
    # It copies the image's static executables: each one runs with nothing but itself.
    install = "tabbyctl cni install --bin-dir=/host/bin --conf-dir=/host/net.d --mtu=1440"
    _exec(runtime, node, "/bin/sh", "-c", f"{install} --from={CNI_PLUGIN_DIR}")
    assert '"mtu": 1440' in _exec(runtime, node, "cat", "/host/net.d/10-tabby.conflist")
    for name in NODE_CNI_EXECUTABLES:
        version = _exec(runtime, node, "env", "-i", "CNI_COMMAND=VERSION", f"/host/bin/{name}")
        assert '"supportedVersions"' in version and '"1.1.0"' in version, (name, version)

    # The controllers' securityContext: nobody, read-only root; bytecode is in the image.
    ctl = _container(
        runtime, pod, "controllers", "tabby:0.1.0",
        command=["sleep", "infinity"],
        linux={"security_context": {"run_as_user": {"value": 65534}, "readonly_rootfs": True}},
    )  # fmt: skip
    assert "usage: tabby-controllers" in _exec(runtime, ctl, "tabby-controllers", "--help")
    assert _exec(runtime, ctl, "id", "-u").strip() == "65534"
    verbose = _exec(runtime, ctl, "python3", "-v", "-c", "import felix.agent")
    assert f"code object from '{SITE_PACKAGES}/felix/__pycache__/agent.cpython-311.pyc'" in verbose


def test_agnhost_image_has_the_upstream_layout_and_shells(
    node_with_containerd: tuple[Lab, Containerd, Path],
    pause_archive: Path,
    agnhost_archive: Path,
) -> None:
    runtime = _started(node_with_containerd, pause_archive)
    # The older tags cyclonus (2.43) and network-policy-api (2.45) pin name the same image.
    assert import_images(runtime.socket, [agnhost_archive]) == [AGNHOST_IMAGE, *AGNHOST_ALIASES]
    assert {AGNHOST_IMAGE, *AGNHOST_ALIASES} <= set(_repo_tags(runtime))
    config = _image_config(runtime, AGNHOST_IMAGE)
    assert (config["Entrypoint"], config["Cmd"]) == (["/agnhost"], ["pause"])

    pod = runtime.run_pod_sandbox("images", "default")
    cid = _container(runtime, pod, "agnhost", AGNHOST_IMAGE)  # the image's own ENTRYPOINT/CMD
    state = json.loads(runtime.crictl("inspect", cid))["status"]["state"]
    assert state == "CONTAINER_RUNNING"
    usage = _exec(runtime, cid, "/agnhost", "--help")
    for command in ("connect", "serve-hostname", "porter", "netexec", "pause"):
        assert f"  {command} " in usage, command
    assert "serve-hostname" in _exec(runtime, cid, "/agnhost-2", "--help")
    # network-policy-api runs `/bin/bash -c "/agnhost ..."`; e2e uses sh, nc and wget.
    assert "connect" in _exec(runtime, cid, "/bin/bash", "-c", "/agnhost --help | grep connect")
    tools = _exec(runtime, cid, "/bin/sh", "-c", "which nc wget nslookup ip cat curl")
    assert len(tools.split()) == 6
    # The Services specs run `echo x | nc -w 1 -u IP PORT` and curl through sh: PATH must
    # decide, as in upstream's alpine image (Debian's busybox sh runs its own nc, no -u).
    assert "UDP" in _exec(runtime, cid, "/bin/sh", "-c", "nc -h 2>&1; true")
    assert _exec(runtime, cid, "/bin/sh", "-c", "curl --version").startswith("curl ")
    # ... and `wget -q -O - -T 1 URL` (busybox 1.35's wget segfaults on -T).
    assert "GNU Wget" in _exec(runtime, cid, "/bin/sh", "-c", "wget --version")


def test_a_nameless_archive_is_refused_before_ctr_would_import_nothing(
    tmp_path: Path, pause_archive: Path
) -> None:
    """skopeo#2568: a docker-archive with empty RepoTags imports nothing, silently."""
    layout = tmp_path / "oci"
    subprocess.run(
        ["skopeo", "--insecure-policy", "copy", "--quiet",
         f"docker-archive:{pause_archive}", f"oci:{layout}:x"],
        check=True,
    )  # fmt: skip
    nameless = tmp_path / "nameless.tar"
    subprocess.run(
        ["skopeo", "--insecure-policy", "copy", "--quiet", f"oci:{layout}:x",
         f"docker-archive:{nameless}"],
        check=True,
    )  # fmt: skip
    with tarfile.open(nameless) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        assert not json.load(member)[0].get("RepoTags")
    with pytest.raises(ImageBuildError, match="names no image"):
        import_images(tmp_path / "no-containerd.sock", [nameless])
