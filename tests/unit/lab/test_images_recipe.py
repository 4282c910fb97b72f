"""lab.images' pure parts: what the recipe reads, how caches are keyed, what the layers hold.

The builds themselves (mmdebstrap, umoci, skopeo, containerd) are proved in
tests/integration/runtime/test_images.py.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from lab.images import (
    REPO,
    SITE_PACKAGES,
    TABBY_IMAGE,
    VENV,
    ImageBuildError,
    Layer,
    Project,
    archive_names,
    base_key,
    busybox_applets,
    console_script,
    ldd_paths,
    mmdebstrap_argv,
    normalize_ref,
    top_key,
    write_tabby_layer,
)

PYPROJECT = """
[project]
name = "demo"
version = "1.2.3"
dependencies = ["click>=8.1"]

[project.scripts]
demo = "demo.main:cli"

[tool.setuptools.packages.find]
include = ["demo*"]
"""


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """A small project shaped like Tabby's: a package, a subpackage, and files around them."""
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    for rel, text in {
        "demo/__init__.py": "",
        "demo/main.py": "def cli():\n    return 0\n",
        "demo/sub/__init__.py": "",
        "demo/sub/mod.py": "X = 1\n",
        "demo/data/notes.py": "# in a directory without __init__.py: not a package\n",
        "demo/README.txt": "not packaged\n",
        "other/__init__.py": "",  # matches no include pattern
        "tests/test_demo.py": "",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return Project.load(tmp_path)


def test_project_reads_what_setuptools_would_package(project: Project) -> None:
    assert (project.name, project.version) == ("demo", "1.2.3")
    assert project.scripts == {"demo": "demo.main:cli"}
    assert project.packages() == ["demo"]
    assert [str(p) for p in project.source_files()] == [
        "demo/__init__.py",
        "demo/main.py",
        "demo/sub/__init__.py",
        "demo/sub/mod.py",
    ]


def test_the_repo_project_names_every_package_the_dockerfile_copies() -> None:
    """The Dockerfile lists the same packages by hand: the two must agree."""
    copied = {
        line.split()[1].rstrip("/")
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and line.split()[1].endswith("/")
    }
    assert set(Project.load().packages()) == copied
    assert {"tabby-node", "tabbyctl", "tabby-controllers"} <= set(Project.load().scripts)


def test_top_key_follows_the_sources_and_base_key_the_dependencies(project: Project) -> None:
    base, top = base_key(project), top_key(project, base_key(project))
    (project.root / "tests" / "test_demo.py").write_text("changed, but not packaged\n")
    (project.root / "demo" / "README.txt").write_text("changed, but not packaged\n")
    assert top_key(project, base) == top
    (project.root / "demo" / "sub" / "mod.py").write_text("X = 2\n")
    assert top_key(project, base) != top
    assert base_key(Project.load(project.root)) == base
    pyproject = project.root / "pyproject.toml"
    pyproject.write_text(PYPROJECT.replace('"click>=8.1"', '"click>=8.1", "rich>=13"'))
    assert base_key(Project.load(project.root)) != base


def _members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar.getmembers()}


def _read(path: Path, name: str) -> bytes:
    with tarfile.open(path) as tar:
        member = tar.extractfile(name)
        assert member is not None
        return member.read()


def test_tabby_layer_installs_like_pip_into_the_venv(project: Project, tmp_path: Path) -> None:
    with Layer(tmp_path / "top.tar") as layer:
        used = write_tabby_layer(layer, project, tmp_path / "pyc")
    members = _members(layer.path)
    site = SITE_PACKAGES.strip("/")
    assert f"{site}/demo/sub/mod.py" in members
    assert f"{site}/demo/data/notes.py" not in members
    script = _read(layer.path, f"{VENV.strip('/')}/bin/demo").decode()
    assert script.startswith(f"#!{VENV}/bin/python\n") and "from demo.main import cli" in script
    assert members[f"{VENV.strip('/')}/bin/demo"].mode == 0o755
    entry_points = _read(layer.path, f"{site}/demo-1.2.3.dist-info/entry_points.txt").decode()
    assert "demo = demo.main:cli" in entry_points
    record = _read(layer.path, f"{site}/demo-1.2.3.dist-info/RECORD").decode()
    assert "demo/main.py,sha256=" in record and "../../../bin/demo,sha256=" in record
    # Checked-hash bytecode (PEP 552 flags = 3): valid whatever the files' times.
    pyc = _read(layer.path, f"{site}/demo/__pycache__/main.cpython-311.pyc")
    assert int.from_bytes(pyc[4:8], "little") == 3
    assert len(used) == 4
    # Root-owned, fixed times, parents before children: the same input, the same digest.
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 315532800)}
    names = list(members)
    assert names.index(f"{site}/demo") < names.index(f"{site}/demo/main.py")


def test_the_same_sources_give_the_same_layer_bytes(project: Project, tmp_path: Path) -> None:
    digests = []
    for name in ("a.tar", "b.tar"):
        with Layer(tmp_path / name) as layer:
            write_tabby_layer(layer, project, tmp_path / "pyc")
        digests.append((tmp_path / name).read_bytes())
    assert digests[0] == digests[1]


def test_console_script_runs_the_entry_point() -> None:
    namespace: dict[str, object] = {"__name__": "not-main"}
    exec(console_script("json:dumps").decode().split("\n", 1)[1], namespace)
    assert namespace["dumps"] is json.dumps


@pytest.mark.parametrize(
    ("ref", "normalized"),
    [
        ("tabby:0.1.0", TABBY_IMAGE),
        ("docker.io/library/tabby:0.1.0", TABBY_IMAGE),
        ("library/tabby:0.1.0", TABBY_IMAGE),
        ("index.docker.io/library/tabby:0.1.0", TABBY_IMAGE),
        ("busybox", "docker.io/library/busybox:latest"),
        ("me/tool", "docker.io/me/tool:latest"),
        ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"),
        ("localhost:5000/x", "localhost:5000/x:latest"),
        ("localhost/x:1", "localhost/x:1"),
        ("probe.local/busybox:1.0", "probe.local/busybox:1.0"),
    ],
)
def test_normalize_ref_matches_containerd(ref: str, normalized: str) -> None:
    assert normalize_ref(ref) == normalized


def _docker_archive(path: Path, repo_tags: list[str] | None) -> Path:
    manifest = json.dumps([{"Config": "c.json", "RepoTags": repo_tags, "Layers": []}]).encode()
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    return path


def test_archive_names_reads_repo_tags_and_refuses_a_nameless_archive(tmp_path: Path) -> None:
    named = _docker_archive(tmp_path / "named.tar", ["tabby:0.1.0"])
    assert archive_names(named) == [TABBY_IMAGE]
    with pytest.raises(ImageBuildError, match="names no image"):
        archive_names(_docker_archive(tmp_path / "nameless.tar", None))


def test_ldd_paths_keeps_libraries_and_the_loader() -> None:
    output = """\tlinux-vdso.so.1 (0x00007ffd)
\tlibtinfo.so.6 => /lib/x86_64-linux-gnu/libtinfo.so.6 (0x00007f5b)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f5b)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f5b)
"""
    assert ldd_paths(output) == [
        "/lib/x86_64-linux-gnu/libtinfo.so.6",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
    ]


def test_busybox_applets_leave_out_busybox_and_the_host_tools() -> None:
    listed = "bin/sh\nbin/busybox\nusr/bin/wget\nbin/bash\nusr/bin/nc\nsbin/ip\nbin/ls\n\n"
    assert busybox_applets(listed) == ["bin/ls"]


def test_mmdebstrap_installs_the_wheels_offline_with_the_images_python(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels-x"
    wheels.mkdir()
    (wheels / "pip-26.0-py3-none-any.whl").write_bytes(b"")
    argv = mmdebstrap_argv(tmp_path / "r.tar", wheels, tmp_path / "debs", tmp_path / "f.txt")
    hooks = " ".join(a for a in argv if a.startswith("--customize-hook="))
    assert (
        f"{VENV}/bin/python /tmp/wheels-x/pip-26.0-py3-none-any.whl/pip install --no-index" in hooks
    )
    assert "env -i" in hooks  # the host's PIP_* settings stay outside
    assert "--include=python3,iptables,ipset,iproute2,conntrack,kmod,mawk" in argv
