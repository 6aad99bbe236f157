"""No secret on a command line, where every account of the machine reads it (ps): the CLI takes
its token from a file only its user may read (--token-file, $ARRANGER_TOKEN_FILE), still
takes `--token` but warns, and the store's password given in `--store` is warned of too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.test_auth import in_thread, issue, secured

REPO = Path(__file__).resolve().parents[2]


async def test_a_token_file_is_read_and_a_token_on_the_command_line_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ARRANGER_TOKEN", raising=False)
    async with secured(tmp_path) as cluster:
        token = await issue(cluster, "alice", capsys)
        ca = str(cluster.tls / "ca.pem")
        secret = tmp_path / "token"
        secret.write_text(token + "\n")
        secret.chmod(0o600)
        base = ("--server", cluster.address, "--ca", ca)

        capsys.readouterr()
        assert await in_thread(*base, "--token-file", str(secret), "list") == 0
        assert "warning" not in capsys.readouterr().err

        monkeypatch.setenv("ARRANGER_TOKEN_FILE", str(secret))
        assert await in_thread(*base, "list") == 0
        monkeypatch.delenv("ARRANGER_TOKEN_FILE")

        assert await in_thread(*base, "--token", token, "list") == 0
        assert "--token is readable by every account" in capsys.readouterr().err

        secret.chmod(0o644)  # as ssh refuses a key others may read
        assert await in_thread(*base, "--token-file", str(secret), "list") == 1
        err = capsys.readouterr().err
        assert f"--token-file {secret}: others may read it" in err and token not in err

        assert await in_thread(*base, "--token-file", str(tmp_path / "none"), "list") == 1
        assert "No such file" in capsys.readouterr().err


def test_a_store_password_on_the_command_line_is_warned_of(tmp_path: Path) -> None:
    url = "postgresql://arranger:hunter2@127.0.0.1:9/arranger?connect_timeout=1"
    env = {k: v for k, v in os.environ.items() if k != "ARRANGER_STORE"}
    env["PYTHONPATH"] = str(REPO)
    for argv in (
        ["server", "--store", url, "--backup", str(tmp_path / "b")],
        ["token", "list", "--store", url],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "arranger.client.cli", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 1
        assert "the password in --store is readable by every account" in done.stderr
        assert "hunter2" not in done.stderr + done.stdout
    # Given in the environment instead, it is not.
    env["ARRANGER_STORE"] = url
    done = subprocess.run(
        [sys.executable, "-m", "arranger.client.cli", "token", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "readable by every account" not in done.stderr
