"""containers builds the image container tests run, without a registry: a root filesystem of
one static busybox and its applets, turned into an image by `podman import` (the same steps
README's Containers section gives). Tests that need it skip, saying why, where podman cannot run it."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from arranger.agent.podman import Podman, find_podman, ulimits

IMAGE = "localhost/arranger-test-busybox:1"


@functools.cache
def _image() -> tuple[Podman | None, str]:
    podman, why = find_podman()
    if podman is None:
        return None, why
    busybox = shutil.which("busybox")
    if busybox is None:
        return None, "busybox is not installed (Debian: busybox-static)"
    with tempfile.TemporaryDirectory(prefix="arranger-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        for d in ("bin", "tmp", "data", "work"):
            (root / d).mkdir(parents=True)
        (root / "tmp").chmod(0o1777)
        shutil.copy(busybox, root / "bin" / "busybox")
        applets = subprocess.run(
            [busybox, "--list"], capture_output=True, text=True, check=False
        ).stdout.split()
        for applet in applets:
            if applet != "busybox":
                (root / "bin" / applet).symlink_to("busybox")
        archive = Path(tmp) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        imported = subprocess.run(
            [
                *podman.base,
                "import",
                "--change",
                "ENV=PATH=/bin",
                "--change",
                "WORKDIR=/work",
                str(archive),
                IMAGE,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if imported.returncode != 0:
        return None, f"podman import failed: {imported.stderr.strip()}"
    tried = subprocess.run(
        [*podman.base, "run", "--rm", "--network", "host", *ulimits(), IMAGE, "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if tried.returncode != 0:
        return None, f"podman run {IMAGE} true failed: {tried.stderr.strip()}"
    return podman, ""


def busybox_image() -> Podman:
    """busybox_image: podman, once the test image is there and runs; skips the test if not."""
    podman, why = _image()
    if podman is None:
        pytest.skip(f"containers cannot run here: {why}")
    return podman


def containers_of(podman: Podman, node: str) -> list[str]:
    """containers_of: the names of the containers podman still has for a node."""
    done = subprocess.run(
        [
            *podman.base,
            "ps",
            "--all",
            "--filter",
            f"label=arranger.node={node}",
            "--format",
            "{{.Names}}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()
