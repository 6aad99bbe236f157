"""The agent's unpacker refuses archives that would reach out of the pod's directory."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tracemalloc
import zlib
from pathlib import Path

import pytest

from arranger.agent import unpack
from arranger.agent.packages import UNPACK_SOURCE
from arranger.agent.unpack import MAX_ENTRIES, MAX_HEADER_BYTES, MAX_NAME_BYTES, Refused

MIB = 2**20


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


def pax(info: tarfile.TarInfo, **records: str) -> tarfile.TarInfo:
    info.pax_headers = records
    return info


def gzipped(*blocks: bytes, zeros: int = 0) -> io.BytesIO:
    """gzipped: a gzipped tar of raw blocks (headers and data as tarfile writes them), with
    `zeros` zero bytes after the first: 780 KB of them gzipped hold 800 MB."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [packer.compress(blocks[0])]
    chunk = bytes(MIB)
    for start in range(0, zeros, MIB):
        out.append(packer.compress(chunk[: min(MIB, zeros - start)]))
    out += [packer.compress(b) for b in blocks[1:]]
    out.append(packer.compress(bytes(2 * tarfile.BLOCKSIZE)) + packer.flush())
    return io.BytesIO(b"".join(out))


def header(name: str, kind: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = kind, size, 0o644
    return info.tobuf(tarfile.USTAR_FORMAT)


def test_a_huge_pax_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """The review's package: one pax header of 256 MiB (zeros: well under 1 MB gzipped), which
    tarfile would read whole into memory to parse. It is refused from its header alone."""
    size = 256 * MIB
    hostile = gzipped(
        header("./PaxHeaders/f", tarfile.XHDTYPE, size), header("f", tarfile.REGTYPE, 0), zeros=size
    )
    assert len(hostile.getvalue()) < MIB
    tracemalloc.start()
    try:
        with pytest.raises(Refused, match=f"extended headers .* of more than {MAX_HEADER_BYTES}"):
            unpack.unpack(hostile, str(tmp_path), 100)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MIB, f"the unpacker held {peak} bytes at its peak"


def test_global_pax_headers_are_bounded_in_all(tmp_path: Path) -> None:
    """Global headers each within the bound, but more than it in all (tarfile keeps them all,
    and applies them to every entry after them)."""
    half = tarfile.TarInfo.create_pax_global_header({"comment": "g" * (MAX_HEADER_BYTES // 2)})
    blocks = [half, header("a", tarfile.REGTYPE, 0), half, header("b", tarfile.REGTYPE, 0)]
    with pytest.raises(Refused, match=f"global pax headers of more than {MAX_HEADER_BYTES} bytes"):
        unpack.unpack(gzipped(*blocks), str(tmp_path), 100)


def test_extended_headers_within_the_bounds_unpack(tmp_path: Path) -> None:
    """Long names and links (GNU headers, pax records) and pax records within the bounds."""
    name = "d/" + "n" * 250
    members = (
        file(name, b"long\n"),
        (entry("d/link", tarfile.SYMTYPE, "t" * 500), b""),
        (pax(file("p")[0], comment="c" * 1000), b"y"),
    )
    for form in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:gz", format=form) as tar:
            for info, data in members:
                info.size = len(data) if info.isreg() else 0
                tar.addfile(info, io.BytesIO(data))
        out.seek(0)
        dest = tmp_path / str(form)
        dest.mkdir()
        assert unpack.unpack(out, str(dest), 100) == 6
        assert (dest / name).read_text() == "long\n"


def test_a_tree_unpacks(tmp_path: Path) -> None:
    dirs = entry("pkg", tarfile.DIRTYPE)
    dirs.mode = 0o755
    setuid = entry("pkg/tool")
    setuid.mode = 0o4777
    got = archive(
        (dirs, b""),
        file("pkg/m.py", b"X = 1\n"),
        (setuid, b"#!"),
        (entry("alias.py", tarfile.SYMTYPE, "pkg/m.py"), b""),
        (entry("pkg/same.py", tarfile.LNKTYPE, "pkg/m.py"), b""),
        (entry("pkg/up", tarfile.SYMTYPE, "../alias.py"), b""),
    )
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
        ([file("d/" + "n" * MAX_NAME_BYTES)], f"a name of more than {MAX_NAME_BYTES} bytes"),
        (
            [(entry("l", tarfile.SYMTYPE, "t" * (MAX_NAME_BYTES + 1)), b"")],
            f"'l': a link target of more than {MAX_NAME_BYTES} bytes",
        ),
        (
            [(pax(file("big")[0], comment="c" * MAX_HEADER_BYTES), b"x")],
            f"extended headers \\(pax, GNU\\) of more than {MAX_HEADER_BYTES} bytes before one",
        ),
        ([(entry("holes", tarfile.GNUTYPE_SPARSE), b"")], "'holes': a sparse file"),
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
    """The agent runs this source with `python -I -S -c`: it needs only the standard library.
    The archive comes on stdin, or on the descriptor its second argument names."""
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
    with open(tmp_path / "c.tar", "wb") as out:
        out.write(archive(file("c.py")).read())
    with open(tmp_path / "c.tar", "rb") as data:
        by_fd = subprocess.run(
            [*argv, str(data.fileno())],
            stdin=subprocess.DEVNULL,
            pass_fds=(data.fileno(),),
            cwd=tmp_path,
            capture_output=True,
            check=False,
        )
    assert by_fd.returncode == 0, by_fd.stderr
    assert (tmp_path / "c.py").read_text() == "x"
