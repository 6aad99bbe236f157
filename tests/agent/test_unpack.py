"""The agent's unpacker refuses archives that would reach out of the pod's directory."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from arranger.agent import unpack
from arranger.agent.packages import UNPACK_SOURCE
from arranger.agent.unpack import MAX_ENTRIES, Refused


def archive(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    out.seek(0)
    return out


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


def file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return entry(name), data


def test_a_tree_unpacks(tmp_path: Path) -> None:
    dirs = entry("pkg", tarfile.DIRTYPE)
    dirs.mode = 0o755
    setuid = entry("pkg/tool")
    setuid.mode = 0o4777
    got = archive(
        (dirs, b""), file("pkg/m.py", b"X = 1\n"), (setuid, b"#!"),
        (entry("alias.py", tarfile.SYMTYPE, "pkg/m.py"), b""),
        (entry("pkg/same.py", tarfile.LNKTYPE, "pkg/m.py"), b""),
        (entry("pkg/up", tarfile.SYMTYPE, "../alias.py"), b""),
    )  # fmt: skip
    assert unpack.unpack(got, str(tmp_path), 100) == 8
    assert (tmp_path / "alias.py").read_text() == "X = 1\n"
    assert (tmp_path / "pkg/same.py").read_text() == "X = 1\n"
    assert (tmp_path / "pkg/up").read_text() == "X = 1\n"
    assert (tmp_path / "pkg/tool").stat().st_mode & 0o7777 == 0o755


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([file("../evil")], "a path with '..'"),
        ([file("a/../../evil")], "a path with '..'"),
        ([file("/etc/evil")], "an absolute path"),
        ([(entry("l", tarfile.SYMTYPE, "/etc"), b"")], "a symbolic link to the absolute path"),
        ([(entry("l", tarfile.SYMTYPE, "../.."), b"")], "a symbolic link out of the tree"),
        ([(entry("a/l", tarfile.SYMTYPE, "../../x"), b"")], "a symbolic link out of the tree"),
        (
            [(entry("l", tarfile.SYMTYPE, "."), b""), file("l/x")],
            "a path through the symbolic link 'l'",
        ),
        (
            [
                (entry("p/q/d", tarfile.SYMTYPE, "../.."), b""),
                (entry("up", tarfile.SYMTYPE, "p/q/d/.."), b""),
            ],
            "a symbolic link out of the tree",
        ),
        (
            [
                (entry("d", tarfile.DIRTYPE), b""),
                (entry("d/sub", tarfile.SYMTYPE, ".."), b""),
                (entry("up", tarfile.SYMTYPE, "d/sub/d/sub/.."), b""),
            ],
            "a symbolic link out of the tree",
        ),
        (
            [
                (entry("a", tarfile.SYMTYPE, "b"), b""),
                (entry("b", tarfile.SYMTYPE, "."), b""),
                (entry("up", tarfile.SYMTYPE, "a/x/../.."), b""),
            ],
            "a symbolic link out of the tree",
        ),
        (
            [
                (entry("up", tarfile.SYMTYPE, "x/../escape"), b""),
                (entry("x", tarfile.SYMTYPE, "."), b""),
            ],
            "where another one's target climbs out",
        ),
        (
            [
                (entry("d/sub", tarfile.SYMTYPE, ".."), b""),
                (entry("d/sub", tarfile.DIRTYPE), b""),
                (entry("d/sub/l", tarfile.SYMTYPE, "../../evil"), b""),
            ],
            "in place of the symbolic link 'd/sub'",
        ),
        ([(entry("h", tarfile.LNKTYPE, "/etc/passwd"), b"")], "a hard link to '/etc/passwd'"),
        ([(entry("h", tarfile.LNKTYPE, "later"), b""), file("later")], "not a file before it"),
        ([(entry("dev", tarfile.CHRTYPE), b"")], "a device, fifo or other special file"),
        ([(entry("fifo", tarfile.FIFOTYPE), b"")], "a device, fifo or other special file"),
        ([file("a", b"x" * 60), file("b", b"y" * 60)], "unpacks to more than 100 bytes"),
    ],
)
def test_hostile_archives_are_refused(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], why: str
) -> None:
    dest = tmp_path / "work"
    dest.mkdir()
    with pytest.raises(Refused, match=why):
        unpack.unpack(archive(*members), str(dest), 100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # nothing landed beside it


def test_too_many_entries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(unpack, "MAX_ENTRIES", 3)
    with pytest.raises(Refused, match="more than 3 entries"):
        unpack.unpack(archive(*(file(f"f{i}") for i in range(4))), str(tmp_path), 100)
    assert MAX_ENTRIES > 3


def test_not_an_archive(tmp_path: Path) -> None:
    with pytest.raises(Refused, match="cannot unpack"):
        unpack.unpack(io.BytesIO(b"not gzip at all"), str(tmp_path), 100)


def test_the_agent_runs_it_as_a_program_in_isolated_mode(tmp_path: Path) -> None:
    """The agent runs this source with `python -I -S -c`: it needs only the standard library."""
    argv = [sys.executable, "-I", "-S", "-c", UNPACK_SOURCE, "100"]
    good = subprocess.run(
        argv, input=archive(file("a.py")).read(), cwd=tmp_path, capture_output=True, check=False
    )
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "a.py").read_text() == "x"
    bad = subprocess.run(
        argv, input=archive(file("../b")).read(), cwd=tmp_path, capture_output=True, check=False
    )
    assert bad.returncode == unpack.REFUSED
    assert bad.stderr.decode().strip() == "'../b': a path with '..'"
