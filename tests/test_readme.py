"""The README's shell recipes work as written: each ```sh block is read from README.md (never
copied here) and run by bash in a scratch directory, and what it made is checked. The
Quickstart's block is the one exception: its two lines are what `arranger dev --demo` and CI
(.ci/run) run on a fresh clone, minutes each, so here they are only matched against them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from arranger.agent.podman import ulimits
from tests.containers import busybox_image

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def recipes() -> dict[str, str]:
    """recipes: every ```sh block of the README by its first line (indentation removed)."""
    text = README.read_text()
    found = {}
    for match in re.finditer(r"^( *)```sh\n(.*?)^\1```$", text, re.S | re.M):
        indent = len(match.group(1))
        body = "\n".join(line[indent:] for line in match.group(2).splitlines())
        found[body.splitlines()[0]] = body + "\n"
    return found


def recipe(starting: str) -> str:
    chosen = [body for first, body in recipes().items() if first.startswith(starting)]
    assert len(chosen) == 1, f"README must have one ```sh recipe starting {starting!r}"
    return chosen[0]


def run(body: str, cwd: Path) -> None:
    """run: the recipe under bash -e in `cwd`, with this Python's scripts first on PATH (where
    `pip install .` puts `arranger`)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", body],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{body}\nexit {done.returncode}: {done.stderr}"


def test_the_quickstart_is_what_ci_and_a_new_user_run() -> None:
    quickstart = recipe("pip install .").splitlines()
    assert quickstart == [
        "pip install . && arranger dev --demo",
        "pip install '.[test]' && python -m pytest",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q '.[dev]'" in ci and "python -m pytest" in ci
    assert '"arranger[test]"' in (ROOT / "pyproject.toml").read_text()  # dev includes test


def test_certs_recipe(tmp_path: Path) -> None:
    run(recipe("arranger certs"), tmp_path)
    tls = tmp_path / "tls"
    for name in ("ca.pem", "ca.key", "server.pem", "server.key", "gpu-01.pem", "gpu-02.key"):
        assert (tls / name).is_file(), name
    server = x509.load_pem_x509_certificate((tls / "server.pem").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "head-node" in names.get_values_for_type(x509.DNSName)


def test_image_without_a_registry_recipe(tmp_path: Path) -> None:
    podman = busybox_image()  # skips, saying why, where containers cannot run
    image = "localhost/busybox:1"
    body = recipe("mkdir -p rootfs/bin")
    assert image in body

    def remove() -> None:
        subprocess.run([*podman.base, "rmi", "--force", image], capture_output=True, check=False)

    remove()
    try:
        run(body, tmp_path)
        link = tmp_path / "rootfs" / "bin" / "busybox"
        assert link.is_file() and not link.is_symlink(), "busybox must stay the binary"
        said = subprocess.run(
            [
                *podman.base,
                "run",
                "--rm",
                "--network",
                "host",
                *ulimits(),
                image,
                "sh",
                "-c",
                "echo made from a rootfs",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert said.returncode == 0, said.stderr
        assert said.stdout == "made from a rootfs\n"
    finally:
        remove()


def test_every_recipe_is_tested() -> None:
    tested = ("pip install .", "arranger certs", "mkdir -p rootfs/bin")
    untested = [first for first in recipes() if not first.startswith(tested)]
    if untested:
        pytest.fail(f"README recipes without a test here: {untested}")
