"""Container images for lab nodes, built with no Docker daemon and no registry.

A lab node's kubelet runs real pods, so its containerd needs the images those pods
name, already in its store (pods use imagePullPolicy IfNotPresent and nothing is ever
pulled):

- pause (the sandbox), from lab.runtime.build_pause_image;
- agnhost (`registry.k8s.io/e2e-test-images/agnhost:2.63.0`), the upstream e2e test
  server: the binary hack/build-k8s.sh built, the upstream layout (/agnhost,
  /agnhost-2, ENTRYPOINT /agnhost, CMD pause), busybox with every applet, and the
  host's dash (/bin/sh), bash, curl, wget, nc (OpenBSD) and ip with their libraries, as
  upstream's alpine image adds them (network-policy-api runs `/bin/bash -c
  "/agnhost ..."`, the Services specs exec curl and `nc -u`);
- coredns (`registry.k8s.io/coredns/coredns:v1.14.7`), the cluster DNS the lab deploys
  (lab/coredns.yaml): the static binary hack/build-k8s.sh built, at /coredns;
- tabby (`image: tabby:0.1.0` in manifests/, which containerd's CRI plugin reads as
  `docker.io/library/tabby:0.1.0`): what the DaemonSet and the controllers run.

The Tabby image has two layers so that a code change costs seconds. The BASE layer
is a Debian bookworm root filesystem made by mmdebstrap from Debian packages
(python3, iptables, ipset, iproute2, conntrack, kmod) plus a venv at /opt/tabby with
Tabby's runtime dependencies, installed by the image's own python from wheels the
host built; it is keyed on the recipe and pyproject's dependency list. The TOP layer
holds Tabby's own packages (with bytecode), its dist-info and its console scripts,
and the static node-side CNI executables (hack/build-cni.sh: the forwarder, portmap,
bandwidth) at CNI_PLUGIN_DIR, written here as a tar: no unpacking, no pip, keyed on
the sources' and the executables' hashes.

The recipe mirrors the repo's Dockerfile. Why a venv: bgp.speaker runs the `exabgp`
script found beside sys.executable, so the interpreter and the scripts must share a
bin/ directory (python:3.11-slim has both in /usr/local/bin; Debian's python3 is in
/usr/bin, pip's scripts would not be).

Images are OCI layouts (umoci) turned into docker-archive tars (skopeo) with their
full name in RepoTags: a nameless archive imports nothing, silently (skopeo#2568).
Everything lives in $TABBY_CACHE_DIR/images/; archives are named by a key of their
content and appear only complete (written aside, then renamed), so a half-built one
is never used; a file lock serialises builders from parallel sessions.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import fnmatch
import hashlib
import io
import json
import logging
import os
import py_compile
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from cni import install
from lab.runtime import PAUSE_IMAGE, build_pause_image

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent

AGNHOST_IMAGE = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
# The same image under the older tags the upstream policy suites pin (cyclonus v0.5.6: 2.43,
# network-policy-api v0.3.0 conformance: 2.45). There is no registry to pull those from; the
# subcommands they run (serve-hostname, connect, porter) are unchanged in 2.63.0.
AGNHOST_ALIASES = (
    "registry.k8s.io/e2e-test-images/agnhost:2.43",
    "registry.k8s.io/e2e-test-images/agnhost:2.45",
)
# The manifests say `image: tabby:0.1.0`; containerd's CRI normalises it to this.
TABBY_IMAGE = "docker.io/library/tabby:0.1.0"

DEBIAN_SUITE = "bookworm"
DEBIAN_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# What the pods run, beyond Essential (coreutils, dash as /bin/sh, findutils, grep,
# sed): the agent's tools, and mawk for the DaemonSet's start script.
BASE_PACKAGES = ("python3", "iptables", "ipset", "iproute2", "conntrack", "kmod", "mawk")
# Documentation and translations are not needed in a container (copyrights stay).
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
# kubernetes>=30 ships a second, asyncio copy of its whole client (kubernetes/aio, 66 MB
# with bytecode, a fifth of the image); Tabby uses the sync client only, nothing in
# the package imports aio, and every node imports the image: leave it out.
PRUNED = ("kubernetes/aio",)
VENV = "/opt/tabby"
PYTHON_TAG = "python3.11"  # bookworm's python3; wheels and bytecode are built for it
SITE_PACKAGES = f"{VENV}/lib/{PYTHON_TAG}/site-packages"
IMAGE_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The static node-side executables (hack/build-cni.sh) that install-cni copies to a
# node's /opt/cni/bin, where it looks for them; the Dockerfile puts them there too.
CNI_PLUGIN_DIR = str(install.EXECUTABLES_DIR)
NODE_CNI_EXECUTABLES = (install.PLUGIN, *install.CHAINED)
# Bump when the recipe changes in a way the constants above do not show.
BASE_RECIPE_VERSION = 1
TOP_RECIPE_VERSION = 1
AGNHOST_RECIPE_VERSION = 2
# The lab's cluster DNS (lab/coredns.yaml); the tag is the version hack/build-k8s.sh builds.
COREDNS_IMAGE = "registry.k8s.io/coredns/coredns:v1.14.7"
COREDNS_RECIPE_VERSION = 1
# Layer entries get a fixed time: the same input gives the same layer digest.
LAYER_MTIME = 315532800  # 1980-01-01, as in wheels
KEEP_ARCHIVES = 2  # per image: the current one and the one before
BASE_BUILD_TIMEOUT_S = 1800


class ImageBuildError(RuntimeError):
    """A build step failed; the message carries the command and its output's tail."""


# -- paths, keys and locks --------------------------------------------------------------
def images_dir() -> Path:
    """$TABBY_CACHE_DIR/images (the repo's .cache/ when unset, as hack/build-k8s.sh)."""
    return Path(os.environ.get("TABBY_CACHE_DIR") or REPO / ".cache") / "images"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _key(parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@contextlib.contextmanager
def _locked(cache: Path, name: str) -> Iterator[None]:
    """One builder at a time per image, across processes (parallel test sessions)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    """Log how long a build step took (python -m lab.images -v shows them)."""
    start = time.monotonic()
    yield
    log.info("%s: %.1f s", what, time.monotonic() - start)


def _run(
    argv: Sequence[str | Path], *, timeout: float = 600, env: dict[str, str] | None = None
) -> str:
    proc = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-3000:]
        raise ImageBuildError(f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{tail}")
    return proc.stdout


def _publish(partial: Path, archive: Path) -> Path:
    """Rename a finished archive into place: readers see all of it or nothing."""
    os.replace(partial, archive)
    return archive


def _prune(cache: Path, pattern: str, keep: int, current: Path) -> None:
    """Remove all but the `keep` most recently used entries matching pattern."""
    os.utime(current)
    entries = sorted(cache.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[keep:]:
        if old != current:
            shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)


# -- layers -------------------------------------------------------------------------------
class Layer:
    """An uncompressed layer tar written from Python: root-owned, fixed times, parents first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tar = tarfile.open(path, "w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 (closed by __exit__)
        self._dirs: set[str] = set()

    def __enter__(self) -> Layer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tar.close()

    def _info(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        name = name.strip("/")
        parent = name.rpartition("/")[0]
        if parent and parent not in self._dirs:
            self.directory(parent)
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = kind, mode, LAYER_MTIME
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    def directory(self, name: str, mode: int = 0o755) -> None:
        name = name.strip("/")
        if name in self._dirs:
            return
        info = self._info(name, tarfile.DIRTYPE, mode)
        self._dirs.add(name)
        self._tar.addfile(info)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self._tar.addfile(info, io.BytesIO(data))

    def host_file(self, name: str, source: Path, mode: int | None = None) -> None:
        """A host file's content (links followed), with its mode unless one is given."""
        info = self._info(
            name, tarfile.REGTYPE, mode if mode is not None else source.stat().st_mode & 0o7777
        )
        info.size = source.stat().st_size
        with source.open("rb") as src:
            self._tar.addfile(info, src)

    def symlink(self, name: str, target: str) -> None:
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self._tar.addfile(info)


def _oci_image(layout: Path, tag: str, layers: Iterable[Path], config: Sequence[str]) -> None:
    """A new OCI layout holding one image: empty base, the given layers, then config."""
    _run(["umoci", "init", "--layout", layout])
    _run(["umoci", "new", "--image", f"{layout}:{tag}"])
    for layer in layers:
        _run(["umoci", "raw", "add-layer", "--image", f"{layout}:{tag}", layer], timeout=900)
    _run(["umoci", "config", "--image", f"{layout}:{tag}", *config])


def _docker_archive(
    layout: Path, tag: str, name: str, archive: Path, tmp: Path, aliases: Sequence[str] = ()
) -> Path:
    """skopeo copy to a docker-archive named `name` and `aliases` (RepoTags), published
    atomically."""
    partial = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        _run(
            [
                "skopeo", "--insecure-policy", "--tmpdir", tmp, "copy", "--quiet",
                *(a for alias in aliases for a in ("--additional-tag", alias)),
                f"oci:{layout}:{tag}", f"docker-archive:{partial}:{name}",
            ],
            timeout=900,
        )  # fmt: skip
        return _publish(partial, archive)
    finally:
        partial.unlink(missing_ok=True)


def _config_args(*, entrypoint: Sequence[str], cmd: Sequence[str], env: Sequence[str]) -> list[str]:
    args = ["--config.workingdir", "/"]
    args += [a for e in entrypoint for a in ("--config.entrypoint", e)]
    args += [a for c in cmd for a in ("--config.cmd", c)]
    args += [a for e in env for a in ("--config.env", e)]
    return args


# -- agnhost -------------------------------------------------------------------------------
def ldd_paths(ldd_output: str) -> list[str]:
    """The absolute library paths in ldd's output (the loader included, vdso left out)."""
    paths = []
    for line in ldd_output.splitlines():
        words = line.split()
        if "=>" in words:
            target = words[words.index("=>") + 1]
            if target.startswith("/"):
                paths.append(target)
        elif words and words[0].startswith("/"):
            paths.append(words[0])
    return paths


def _shared_libraries(binary: Path) -> list[Path]:
    proc = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    return [Path(p) for p in ldd_paths(proc.stdout)] if proc.returncode == 0 else []


# What upstream's alpine-based image adds with `apk add curl netcat-openbsd iproute2 bash`:
# its path in the image → the host command that provides it (hack/install-deps.sh). The
# e2e Services specs exec `curl` and `nc -u` in agnhost pods, network-policy-api runs
# `/bin/bash -c`; busybox's applets stand in for the rest of alpine. /bin/sh is dash:
# Debian's busybox shell runs its own applets before PATH (FEATURE_SH_STANDALONE), so
# `sh -c "nc -u ..."` would get busybox's nc, which has no -u; alpine's shell does not.
# wget is GNU wget: Debian's busybox 1.35 wget dies of SIGSEGV on `-T` (a timeout) before
# it connects, and the Services specs run `wget -q -O - -T 1`.
AGNHOST_HOST_TOOLS = {
    "bin/sh": "dash",
    "bin/bash": "bash",
    "usr/bin/curl": "curl",
    "usr/bin/wget": "wget",
    "usr/bin/nc": "nc.openbsd",
    "sbin/ip": "ip",
}


def busybox_applets(list_full: str) -> list[str]:
    """`busybox --list-full` lines (`usr/bin/wget`), minus busybox itself and the
    commands the image takes from the host instead (sh, bash, curl, wget, nc, ip)."""
    replaced = {"busybox", *(Path(path).name for path in AGNHOST_HOST_TOOLS)}
    return [
        line.strip()
        for line in list_full.splitlines()
        if line.strip() and Path(line.strip()).name not in replaced
    ]


@dataclass(frozen=True)
class AgnhostInputs:
    agnhost: Path
    busybox: Path
    tools: dict[str, Path]  # image path → host binary (AGNHOST_HOST_TOOLS)

    @classmethod
    def find(cls, bin_dir: Path) -> AgnhostInputs:
        agnhost = bin_dir / "agnhost"
        if not agnhost.is_file():
            raise ImageBuildError(f"{agnhost} is missing: run hack/build-k8s.sh")
        commands = {"busybox": "busybox", **AGNHOST_HOST_TOOLS}
        found = {path: shutil.which(command) for path, command in commands.items()}
        missing = sorted(commands[path] for path, where in found.items() if where is None)
        if missing:
            raise ImageBuildError(f"not on PATH: {missing} (hack/install-deps.sh)")
        tools = {path: Path(str(found[path])).resolve() for path in AGNHOST_HOST_TOOLS}
        return cls(agnhost, Path(str(found["busybox"])), tools)

    def libraries(self) -> list[Path]:
        """The shared libraries the host tools load (ldd), each once."""
        libs = (lib for tool in self.tools.values() for lib in _shared_libraries(tool))
        return sorted(set(libs))

    def key(self) -> str:
        files = [self.agnhost, self.busybox, *self.tools.values(), *self.libraries()]
        return _key(
            {
                "recipe": AGNHOST_RECIPE_VERSION,
                "image": AGNHOST_IMAGE,
                "aliases": AGNHOST_ALIASES,
                "files": {str(f): sha256_file(f) for f in files},
            }
        )


def write_agnhost_layer(layer: Layer, *, inputs: AgnhostInputs) -> None:
    """Upstream's layout (/agnhost, agnhost-2) plus busybox and the host's dash (as
    /bin/sh), bash, curl, wget, nc and ip (with their libraries) for the tests' shells."""
    layer.host_file("agnhost", inputs.agnhost, 0o755)
    # Upstream: entrypoint tests override the entrypoint with agnhost-2.
    layer.symlink("agnhost-2", "agnhost")
    layer.host_file("bin/busybox", inputs.busybox, 0o755)
    applets = _run([inputs.busybox, "--list-full"])
    for applet in busybox_applets(applets):
        layer.symlink(applet, "/bin/busybox")
    for path, tool in sorted(inputs.tools.items()):
        layer.host_file(path, tool, 0o755)
    for lib in inputs.libraries():
        layer.host_file(str(lib), lib.resolve())
    layer.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
    layer.file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    layer.file("etc/nsswitch.conf", b"hosts: files dns\n")
    layer.directory("root", 0o700)
    layer.directory("tmp", 0o1777)


def build_agnhost_image(bin_dir: Path, cache: Path | None = None) -> Path:
    """The agnhost archive, rebuilt only when agnhost, busybox or a host tool changed."""
    inputs = AgnhostInputs.find(bin_dir)
    image = OneLayerImage(
        "agnhost", AGNHOST_IMAGE, entrypoint=("/agnhost",), cmd=("pause",),
        env=(f"PATH={IMAGE_PATH}",), aliases=AGNHOST_ALIASES,
    )  # fmt: skip
    return _build_one_layer(image, inputs.key(), partial(write_agnhost_layer, inputs=inputs), cache)


# -- coredns ----------------------------------------------------------------------------
def build_coredns_image(bin_dir: Path, cache: Path | None = None) -> Path:
    """The lab's cluster DNS: the static coredns binary hack/build-k8s.sh built, at
    /coredns as upstream's image has it (ENTRYPOINT /coredns)."""
    binary = bin_dir / "coredns"
    if not binary.is_file():
        raise ImageBuildError(f"{binary} is missing: run hack/build-k8s.sh")
    key = _key({"recipe": COREDNS_RECIPE_VERSION, "image": COREDNS_IMAGE,
                "coredns": sha256_file(binary)})  # fmt: skip
    image = OneLayerImage("coredns", COREDNS_IMAGE, entrypoint=("/coredns",), cmd=(), env=())

    def write(layer: Layer) -> None:
        layer.host_file("coredns", binary, 0o755)
        layer.directory("etc/coredns", 0o755)
        layer.directory("tmp", 0o1777)

    return _build_one_layer(image, key, write, cache)


@dataclass(frozen=True)
class OneLayerImage:
    """An image of one layer on an empty base: its cache prefix, name and config."""

    prefix: str
    name: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[str, ...]
    aliases: tuple[str, ...] = ()


def _build_one_layer(
    image: OneLayerImage, key: str, write_layer: Callable[[Layer], None], cache: Path | None
) -> Path:
    """The image's archive for *key*, built under the cache lock only when missing."""
    cache = cache or images_dir()
    archive = cache / f"{image.prefix}-{key[:16]}.tar"
    with _locked(cache, image.prefix):
        _clear_stale(cache, f"{image.prefix}-*")
        if not archive.exists():
            work = _fresh_dir(cache / "tmp" / f"{image.prefix}-{os.getpid()}")
            try:
                with Layer(work / "layer.tar") as layer:
                    write_layer(layer)
                config = _config_args(entrypoint=image.entrypoint, cmd=image.cmd, env=image.env)
                _oci_image(work / "oci", image.prefix, [layer.path], config)
                _docker_archive(
                    work / "oci", image.prefix, image.name, archive, work, image.aliases
                )
            finally:
                shutil.rmtree(work, ignore_errors=True)
        _prune(cache, f"{image.prefix}-*.tar", KEEP_ARCHIVES, archive)
    return archive


def _fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _clear_stale(cache: Path, pattern: str) -> None:
    """Work dirs and partial archives a killed builder left (the caller holds the lock)."""
    for stale in [*(cache / "tmp").glob(pattern), *cache.glob(f".{pattern}.partial")]:
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink(missing_ok=True)


# -- tabby: what the recipe reads from pyproject.toml ----------------------------------
@dataclass(frozen=True)
class Project:
    """What pyproject.toml says about the Tabby package the image installs."""

    root: Path
    name: str
    version: str
    dependencies: tuple[str, ...]
    scripts: dict[str, str]
    package_patterns: tuple[str, ...]

    @classmethod
    def load(cls, root: Path = REPO) -> Project:
        data = tomllib.loads((root / "pyproject.toml").read_text())
        project = data["project"]
        find = data["tool"]["setuptools"]["packages"]["find"]
        return cls(
            root=root,
            name=project["name"],
            version=project["version"],
            dependencies=tuple(project["dependencies"]),
            scripts=dict(project.get("scripts", {})),
            package_patterns=tuple(find.get("include", ["*"])),
        )

    def packages(self) -> list[str]:
        """Top-level packages matching [tool.setuptools.packages.find] include."""
        return sorted(
            p.name
            for p in self.root.iterdir()
            if (p / "__init__.py").is_file()
            and any(fnmatch.fnmatchcase(p.name, pat) for pat in self.package_patterns)
        )

    def source_files(self) -> list[Path]:
        """The files a wheel of Tabby holds: .py and py.typed in (sub)packages, relative."""
        files = []
        for package in self.packages():
            for path in sorted((self.root / package).rglob("*")):
                wanted = path.suffix == ".py" or path.name == "py.typed"
                if wanted and path.is_file() and _in_package(path, self.root):
                    files.append(path.relative_to(self.root))
        return files


def _in_package(path: Path, root: Path) -> bool:
    """Every directory from the top-level package down has an __init__.py (setuptools find)."""
    parent = path.parent
    while parent != root:
        if not (parent / "__init__.py").is_file():
            return False
        parent = parent.parent
    return True


def base_key(project: Project) -> str:
    """What the BASE layer depends on: the Debian recipe and the dependency list."""
    return _key(
        {
            "recipe": BASE_RECIPE_VERSION,
            "suite": DEBIAN_SUITE,
            "sources": DEBIAN_SOURCES,
            "packages": BASE_PACKAGES,
            "dpkg": DPKG_OPTIONS,
            "venv": VENV,
            "python": PYTHON_TAG,
            "path": IMAGE_PATH,
            "pruned": PRUNED,
            "dependencies": sorted(project.dependencies),
        }
    )


def node_cni_executables() -> dict[str, Path]:
    """hack/build-cni.sh's static executables (built if missing), by name."""
    folder = Path(_run([REPO / "hack" / "build-cni.sh"]).strip()).parent
    found = {name: folder / name for name in NODE_CNI_EXECUTABLES}
    missing = [str(path) for path in found.values() if not path.is_file()]
    if missing:
        raise ImageBuildError(f"hack/build-cni.sh left no {', '.join(missing)}")
    return found


def top_key(project: Project, base: str, cni: Mapping[str, Path] | None = None) -> str:
    """What the TOP layer depends on: the base, Tabby's files, its metadata and scripts,
    and the node-side CNI executables it carries."""
    files = {str(f): sha256_file(project.root / f) for f in project.source_files()}
    return _key(
        {
            "recipe": TOP_RECIPE_VERSION,
            "base": base,
            "name": project.name,
            "version": project.version,
            "scripts": project.scripts,
            "dependencies": list(project.dependencies),
            "files": files,
            "cni": {name: sha256_file(path) for name, path in sorted((cni or {}).items())},
        }
    )


# -- tabby: the BASE layer -------------------------------------------------------------------
def _requirements(project: Project) -> str:
    return "".join(f"{dep}\n" for dep in project.dependencies)


def build_wheelhouse(project: Project, dest: Path, cache: Path) -> Path:
    """Wheels of every runtime dependency, built by the host's Python 3.11 (same ABI as
    the image's): python-iptables is an sdist with a C extension and the image has no
    compiler. pip itself is there too, to run from its wheel inside the image."""
    if sys.version_info[:2] != (3, 11):
        raise ImageBuildError(
            f"the image runs Python 3.11; wheels need a 3.11 host python, not {sys.version}"
        )
    partial = _fresh_dir(dest.with_name(f".{dest.name}.{os.getpid()}.partial"))
    (partial / "requirements.txt").write_text(_requirements(project))
    env = {
        **os.environ,
        "PIP_CACHE_DIR": str(cache / "pip-cache"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    pip = [sys.executable, "-m", "pip"]
    _run(
        [*pip, "wheel", "-q", "--wheel-dir", partial, "-r", partial / "requirements.txt"],
        env=env,
        timeout=900,
    )
    _run([*pip, "download", "-q", "--no-deps", "--dest", partial, "pip"], env=env, timeout=300)
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return dest


def mmdebstrap_argv(target: Path, wheels: Path, deb_cache: Path, freeze: Path) -> list[str]:
    """The Debian root filesystem as one tar: packages, then the venv and its wheels.

    Downloaded .debs are kept in deb_cache (sync-in/sync-out) so a rebuild after a
    dependency change downloads nothing. The chroot's pip runs offline (--no-index)
    with a clean environment: the host's PIP_* settings mean nothing in there.
    """
    chroot_env = 'chroot "$1" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8'
    pip_wheel = min(wheels.glob("pip-*.whl")).name  # run from its wheel: no pip in the image
    pip = f"{chroot_env} {VENV}/bin/python /tmp/{wheels.name}/{pip_wheel}/pip"
    return [
        # Root mode mounts /proc, /sys and /dev/pts in the chroot: in a mount namespace
        # of its own those mounts end with it, even if it is killed.
        *("unshare", "--mount", "--propagation", "private", "--"),
        "mmdebstrap",
        "--mode=root",
        "--variant=essential",
        "--format=tar",
        "--quiet",
        # usr-is-merged instead of the usrmerge package (which pulls in all of perl).
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        f"--include={','.join(BASE_PACKAGES)}",
        *(f"--dpkgopt={opt}" for opt in DPKG_OPTIONS),
        "--skip=output/dev",
        "--skip=essential/unlink",
        '--setup-hook=mkdir -p "$1"/var/cache/apt/archives',
        f"--setup-hook=sync-in {deb_cache} /var/cache/apt/archives",
        f"--customize-hook=sync-out /var/cache/apt/archives {deb_cache}",
        f"--customize-hook=copy-in {wheels} /tmp",
        f"--customize-hook={chroot_env} python3 -m venv --without-pip {VENV}",
        f"--customize-hook={pip} install --no-index --find-links /tmp/{wheels.name}"
        f" --no-cache-dir --disable-pip-version-check -q -r /tmp/{wheels.name}/requirements.txt",
        f"--customize-hook={pip} freeze --path {SITE_PACKAGES} > {freeze}",
        "--customize-hook=rm -rf" + "".join(f' "$1"{SITE_PACKAGES}/{p}' for p in PRUNED),
        # The runtime mounts its own; the host's must not travel in the image.
        '--customize-hook=: > "$1"/etc/resolv.conf; echo localhost > "$1"/etc/hostname',
        DEBIAN_SUITE,
        str(target),
        *DEBIAN_SOURCES,
    ]


def _mmdebstrap_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    return {**env, "TMPDIR": str(tmp), "SOURCE_DATE_EPOCH": str(LAYER_MTIME)}


def _base_config() -> list[str]:
    return _config_args(
        entrypoint=["tabby-node"],
        cmd=[],
        env=[f"PATH={IMAGE_PATH}", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1"],
    )


def build_tabby_base(project: Project, cache: Path) -> Path:
    """The OCI layout holding the BASE image (tag `base`); caller holds the tabby lock."""
    key = base_key(project)
    layout = cache / f"tabby-base-{key[:16]}"
    if layout.is_dir():
        os.utime(layout)
        return layout
    if os.geteuid() != 0:
        raise ImageBuildError("the Tabby base layer needs root (mmdebstrap --mode=root)")
    work = _fresh_dir(cache / "tmp" / f"tabby-base-{os.getpid()}")
    try:
        with _step("tabby base: wheels of the dependencies"):
            wheels = build_wheelhouse(project, cache / f"wheels-{key[:16]}", cache)
        deb_cache = cache / "debs"
        deb_cache.mkdir(exist_ok=True)
        rootfs = work / "rootfs.tar"
        freeze = work / "pip-freeze.txt"
        with _step("tabby base: mmdebstrap (debs, venv, pip install)"):
            _run(
                mmdebstrap_argv(rootfs, wheels, deb_cache, freeze),
                env=_mmdebstrap_env(_fresh_dir(work / "tmp")),
                timeout=BASE_BUILD_TIMEOUT_S,
            )
        with _step("tabby base: OCI layout (umoci, gzip)"):
            _oci_image(work / "oci", "base", [rootfs], _base_config())
        shutil.copy2(freeze, work / "oci" / "pip-freeze.txt")
        (work / "oci").rename(layout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(cache, "tabby-base-*", KEEP_ARCHIVES, layout)
    _prune(cache, "wheels-*", 1, cache / f"wheels-{key[:16]}")
    return layout


# -- tabby: the TOP layer --------------------------------------------------------------------
CONSOLE_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from {module} import {attr}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({attr}())
"""


def console_script(entry_point: str) -> bytes:
    """What pip writes for a `module:function` entry point, run by the image's venv."""
    module, _, attr = entry_point.partition(":")
    return CONSOLE_SCRIPT.format(python=f"{VENV}/bin/python", module=module, attr=attr).encode()


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _dist_info(project: Project) -> dict[str, bytes]:
    """METADATA, entry points and friends, so importlib.metadata and pip see Tabby."""
    metadata = ["Metadata-Version: 2.1", f"Name: {project.name}", f"Version: {project.version}"]
    metadata += [f"Requires-Dist: {dep}" for dep in project.dependencies]
    scripts = "".join(f"{name} = {target}\n" for name, target in sorted(project.scripts.items()))
    return {
        "METADATA": ("\n".join(metadata) + "\n").encode(),
        "INSTALLER": b"tabby-lab-images\n",
        "WHEEL": b"Wheel-Version: 1.0\nGenerator: lab.images\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
        "entry_points.txt": f"[console_scripts]\n{scripts}".encode(),
        "top_level.txt": "".join(f"{p}\n" for p in project.packages()).encode(),
    }


def _bytecode(source: Path, image_path: str, cache: Path) -> Path | None:
    """Checked-hash bytecode for the image's 3.11 (same magic as the host's 3.11), cached
    by content: a read-only root filesystem (the controllers) then compiles nothing."""
    if sys.version_info[:2] != (3, 11):
        return None
    data = source.read_bytes()
    cached = cache / f"{hashlib.sha256(data + image_path.encode()).hexdigest()}.pyc"
    if not cached.exists():
        cache.mkdir(parents=True, exist_ok=True)
        py_compile.compile(
            str(source),
            cfile=str(cached),
            dfile=image_path,
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )
    return cached


def write_tabby_layer(
    layer: Layer, project: Project, pyc_cache: Path, cni: Mapping[str, Path] | None = None
) -> set[Path]:
    """Tabby's packages, bytecode, dist-info and console scripts, as pip would install
    them, and the node-side CNI executables; returns the bytecode cache files it used."""
    record: list[str] = []
    used: set[Path] = set()
    for name, path in sorted((cni or {}).items()):
        layer.file(f"{CNI_PLUGIN_DIR}/{name}", path.read_bytes(), 0o755)

    def add(rel: str, data: bytes, mode: int = 0o644) -> None:
        layer.file(f"{SITE_PACKAGES}/{rel}", data, mode)
        record.append(_record_line(rel, data))

    for rel in project.source_files():
        data = (project.root / rel).read_bytes()
        add(str(rel), data)
        if rel.suffix == ".py":
            image_path = f"{SITE_PACKAGES}/{rel}"
            pyc = _bytecode(project.root / rel, image_path, pyc_cache)
            if pyc is not None:
                used.add(pyc)
                add(f"{rel.parent}/__pycache__/{rel.stem}.cpython-311.pyc", pyc.read_bytes())
    dist_info = f"{project.name}-{project.version}.dist-info"
    for name, data in _dist_info(project).items():
        add(f"{dist_info}/{name}", data)
    for name, target in sorted(project.scripts.items()):
        data = console_script(target)
        layer.file(f"{VENV}/bin/{name}", data, 0o755)
        record.append(_record_line(f"../../../bin/{name}", data))
    record.append(f"{dist_info}/RECORD,,")
    layer.file(f"{SITE_PACKAGES}/{dist_info}/RECORD", ("\n".join(record) + "\n").encode())
    return used


def build_tabby_image(project: Project | None = None, cache: Path | None = None) -> Path:
    """The Tabby archive: the cached BASE plus a TOP layer of the current sources."""
    project = project or Project.load()
    cache = cache or images_dir()
    with _locked(cache, "tabby"):
        _clear_stale(cache, "tabby-*")
        _clear_stale(cache, "wheels-*")
        base = build_tabby_base(project, cache)
        cni = node_cni_executables()
        key = top_key(project, base_key(project), cni)
        archive = cache / f"tabby-{project.version}-{key[:16]}.tar"
        if not archive.exists():
            _build_top(project, base, key, archive, cache, cni)
        _prune(cache, f"tabby-{project.version}-*.tar", KEEP_ARCHIVES, archive)
    return archive


def _build_top(
    project: Project,
    layout: Path,
    key: str,
    archive: Path,
    cache: Path,
    cni: Mapping[str, Path],
) -> None:
    """Append the TOP layer under a tag of its own, export it, then drop the tag again."""
    work = _fresh_dir(cache / "tmp" / f"tabby-top-{os.getpid()}")
    tag = f"top-{key[:16]}-{os.getpid()}"
    try:
        with _step("tabby top: layer tar"), Layer(work / "tabby.tar") as layer:
            used = write_tabby_layer(layer, project, cache / "pyc", cni)
        for stale in set((cache / "pyc").glob("*.pyc")) - used:
            stale.unlink(missing_ok=True)
        _run(
            [
                "umoci", "raw", "add-layer", "--image", f"{layout}:base", "--tag", tag,
                "--history.created_by", f"lab.images: Tabby {project.version} sources {key[:16]}",
                layer.path,
            ]
        )  # fmt: skip
        with _step("tabby top: docker-archive (skopeo)"):
            _docker_archive(layout, tag, TABBY_IMAGE, archive, work)
    finally:
        subprocess.run(
            ["umoci", "rm", "--image", f"{layout}:{tag}"], capture_output=True, check=False
        )
        subprocess.run(["umoci", "gc", "--layout", str(layout)], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)


# -- loading into containerd -------------------------------------------------------------
def normalize_ref(ref: str) -> str:
    """A reference as containerd's CRI stores it (docker's normalisation):
    `tabby:0.1.0` -> `docker.io/library/tabby:0.1.0`, `x/y` -> `docker.io/x/y:latest`."""
    name, _, digest = ref.partition("@")
    first, slash, rest = name.partition("/")
    if not slash:
        name = f"docker.io/library/{name}"
    elif not ("." in first or ":" in first or first == "localhost"):
        name = f"docker.io/{name}"
    elif first == "index.docker.io":
        name = f"docker.io/{rest}"
    if name.startswith("docker.io/") and name.count("/") == 1:
        name = f"docker.io/library/{name.removeprefix('docker.io/')}"
    if not digest and ":" not in name.rpartition("/")[2]:
        name += ":latest"
    return f"{name}@{digest}" if digest else name


def archive_names(archive: Path) -> list[str]:
    """The image names a docker-archive carries (manifest.json RepoTags), normalised."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        if member is None:
            raise ImageBuildError(f"{archive} has no manifest.json: not a docker-archive")
        manifest = json.load(member)
    names = [normalize_ref(tag) for entry in manifest for tag in entry.get("RepoTags") or []]
    if not names:
        # ctr would import nothing and say nothing (skopeo#2568).
        raise ImageBuildError(f"{archive} names no image (empty RepoTags)")
    return names


def import_images(socket: Path, archives: Sequence[Path], namespace: str = "k8s.io") -> list[str]:
    """`ctr images import` each archive into containerd at socket, then check by name that
    each is there; returns the names. Raises ImageBuildError naming what is missing."""
    ctr = ["ctr", "-a", str(socket), "-n", namespace]
    expected: list[str] = []
    for archive in archives:
        expected += archive_names(archive)
        _run([*ctr, "images", "import", archive], timeout=600)
    present = set(_run([*ctr, "images", "ls", "-q"]).split())
    missing = [name for name in expected if name not in present]
    if missing:
        raise ImageBuildError(
            f"containerd at {socket} lacks {missing} after import; it has {sorted(present)}"
        )
    return expected


# -- what a node needs ----------------------------------------------------------------------
def build_pause(bin_dir: Path, cache: Path | None = None) -> Path:
    """lab.runtime's pause archive, in the images cache, under the same kind of lock."""
    cache = cache or images_dir()
    with _locked(cache, "pause"):
        return build_pause_image(bin_dir / "pause", cache)


def node_images(bin_dir: Path, cache: Path | None = None) -> list[Path]:
    """Every archive a lab node's containerd needs: pause, agnhost, coredns, tabby."""
    return [
        build_pause(bin_dir, cache),
        build_agnhost_image(bin_dir, cache),
        build_coredns_image(bin_dir, cache),
        build_tabby_image(cache=cache),
    ]


IMAGE_NAMES = {
    "pause": PAUSE_IMAGE,
    "agnhost": AGNHOST_IMAGE,
    "coredns": COREDNS_IMAGE,
    "tabby": TABBY_IMAGE,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Build the node images; print each archive's path, size and build seconds."""
    parser = argparse.ArgumentParser(prog="python -m lab.images", description=main.__doc__)
    parser.add_argument(
        "--bin-dir", type=Path, help="hack/build-k8s.sh's bin dir (default: ask it)"
    )
    parser.add_argument("--only", choices=sorted(IMAGE_NAMES), action="append")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each step's time")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    if args.bin_dir is None:
        from lab.controlplane import k8s_bin_dir

        args.bin_dir = k8s_bin_dir()
    builders = {
        "pause": lambda: build_pause(args.bin_dir),
        "agnhost": lambda: build_agnhost_image(args.bin_dir),
        "coredns": lambda: build_coredns_image(args.bin_dir),
        "tabby": build_tabby_image,
    }
    for name in args.only or list(IMAGE_NAMES):
        start = time.monotonic()
        try:
            path = builders[name]()
        except ImageBuildError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        size = path.stat().st_size / 1e6
        print(f"{IMAGE_NAMES[name]}\t{path}\t{size:.1f} MB\t{time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
