"""The compiled launcher and shim are reused only as the agent built them. A file planted under
the name the next release's source will have (an empty one, say, root's own) is built over, not
run; so is a program that no longer hashes to the record kept beside it, one others may write,
or a record that is not the agent's own. A program built once is reused as it is."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from arranger.agent import launcher

pytestmark = pytest.mark.skipif(
    launcher.which("cc") is None and launcher.which("gcc") is None,
    reason="no C compiler (cc or gcc) on the PATH",
)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    where = tmp_path / "cache"
    where.mkdir(mode=0o755)
    return where


def name_of(source: Path) -> str:
    """name_of: the name the program built from `source` is kept under."""
    return f"{source.stem}-{hashlib.sha256(source.read_bytes()).hexdigest()[:16]}"


def runs(program: str) -> bool:
    """runs: whether `program` is the compiled launcher: on a spec it runs `true`."""
    fd = launcher.spec_fd(["true"], {"PATH": "/bin:/usr/bin"}, Path("/"))
    try:
        done = subprocess.run([program, str(fd)], pass_fds=(fd,), check=False, timeout=30)
        return done.returncode == 0
    finally:
        os.close(fd)


def test_a_planted_empty_program_is_built_over_not_run(cache: Path) -> None:
    planted = cache / name_of(launcher.LAUNCH_SOURCE)
    planted.touch(
        mode=0o755
    )  # the agent's own (root's) and of the right name: as an attacker left it
    path = launcher.compiled(launcher.LAUNCH_SOURCE, cache)
    assert path == str(planted)
    assert planted.stat().st_size > 0 and runs(path)
    record = cache / f"{planted.name}.sha256"
    assert record.read_text() == hashlib.sha256(planted.read_bytes()).hexdigest() + "\n"
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # nothing left aside


def test_a_program_unlike_its_record_or_writable_by_others_is_built_again(cache: Path) -> None:
    path = launcher.compiled(launcher.SHIM_SOURCE, cache)
    assert path is not None
    program = Path(path)
    record = cache / f"{program.name}.sha256"
    built = program.stat().st_ino
    assert launcher.compiled(launcher.SHIM_SOURCE, cache) == path
    assert program.stat().st_ino == built  # reused as it was: not built again

    def rebuilt() -> bool:
        nonlocal built
        assert launcher.compiled(launcher.SHIM_SOURCE, cache) == path
        again, built = program.stat().st_ino != built, program.stat().st_ino
        return (
            again and hashlib.sha256(program.read_bytes()).hexdigest() + "\n" == record.read_text()
        )

    program.write_bytes(program.read_bytes()[:100])  # cut short, in place
    assert rebuilt()
    program.chmod(0o777)  # others may write it
    assert rebuilt()
    record.write_text("0" * 64 + "\n")  # the record says another program
    assert rebuilt()
    record.chmod(0o666)  # others may write the record
    assert rebuilt()
    record.unlink()
    assert rebuilt()
    record.unlink()
    record.symlink_to(cache / "elsewhere")  # a record reached through a link is not one
    (cache / "elsewhere").write_text(hashlib.sha256(program.read_bytes()).hexdigest() + "\n")
    assert rebuilt()
    assert not record.is_symlink()


def test_a_cache_others_may_write_is_not_used(cache: Path) -> None:
    cache.chmod(0o775)
    assert launcher.compiled(launcher.LAUNCH_SOURCE, cache) is None
    cache.chmod(0o755)
    inner = cache / "inner"
    inner.mkdir(mode=0o755)
    cache.chmod(0o777)  # a directory above that others may write (and not sticky)
    assert launcher.compiled(launcher.LAUNCH_SOURCE, inner) is None
    cache.chmod(0o1777)  # sticky, as /tmp: others cannot rename what is not theirs
    assert launcher.compiled(launcher.LAUNCH_SOURCE, inner) is not None
