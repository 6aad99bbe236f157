"""The client's packing of a working directory: ignore files, determinism, links, the cap."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

import pytest

from arranger.client.ignore import IgnoreRules, parse_rules
from arranger.client.package import PackageError, entries, pack


def tree(top: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = top / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return top


def names(top: Path) -> list[str]:
    return [rel for rel, _ in entries(top)]


def test_gitignore_and_arrangerignore_are_honoured(tmp_path: Path) -> None:
    top = tree(
        tmp_path / "proj",
        {
            "train.py": "",
            "model.py": "",
            "notes.log": "",
            "keep.log": "",
            "data/big.bin": "",
            "data/small.txt": "",
            "sub/cache/x.pyc": "",
            "sub/a.py": "",
            "build/out.o": "",
            ".git/HEAD": "",
            "sub/.gitignore": "local.txt\n",
            "sub/local.txt": "",
            "local.txt": "",
            "docs/a.md": "",
            "docs/deep/b.md": "",
            ".gitignore": "# comment\n\n*.log\n!keep.log\nbuild/\n/data/*.bin\n**/cache/\n",
            ".arrangerignore": "docs/**/*.md\n",
        },
    )
    assert names(top) == [
        ".arrangerignore",
        ".gitignore",
        "data",
        "data/small.txt",
        "docs",
        "docs/deep",
        "keep.log",
        "local.txt",
        "model.py",
        "sub",
        "sub/.gitignore",
        "sub/a.py",
        "train.py",
    ]


def test_a_directory_pattern_does_not_match_a_file(tmp_path: Path) -> None:
    top = tree(tmp_path / "p", {".gitignore": "out/\n", "out": "a file", "x/out/y": ""})
    assert names(top) == [".gitignore", "out", "x"]


def test_rules_follow_the_last_match() -> None:
    rules = IgnoreRules()
    rules.rules = parse_rules("*.txt\n!a.txt\nsub/a.txt\n", "")
    assert rules.ignored("b.txt", False)
    assert not rules.ignored("a.txt", False)
    assert rules.ignored("sub/a.txt", False)
    assert not rules.ignored("other/a.txt", False)


def test_the_same_tree_packs_to_the_same_bytes(tmp_path: Path) -> None:
    files = {"train.py": "print(1)\n", "pkg/__init__.py": "", "pkg/m.py": "X = 1\n"}
    first = tree(tmp_path / "a", files)
    second = tree(tmp_path / "b", dict(reversed(list(files.items()))))
    os.utime(second / "train.py", (1, 1))
    (second / "pkg/m.py").chmod(0o600)
    one, two = pack(first, tmp_path), pack(second, tmp_path)
    assert one.sha256 == two.sha256
    assert one.path.read_bytes() == two.path.read_bytes()
    assert hashlib.sha256(one.path.read_bytes()).hexdigest() == one.sha256
    assert one.size == one.path.stat().st_size
    with tarfile.open(one.path) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["pkg", "pkg/__init__.py", "pkg/m.py", "train.py"]
    assert {(m.mtime, m.uid, m.gid, m.uname) for m in members} == {(0, 0, 0, "")}
    (first / "train.py").write_text("print(2)\n")
    assert pack(first, tmp_path).sha256 != one.sha256


def test_what_compresses_is_gzipped_and_what_does_not_is_not(tmp_path: Path) -> None:
    code = tree(
        tmp_path / "code", {f"m{i}.py": "import os\nprint(os.getcwd())\n" * 200 for i in range(5)}
    )
    data = tmp_path / "data"
    data.mkdir()
    (data / "weights.bin").write_bytes(os.urandom(2**20))
    with pack(code, tmp_path).path.open("rb") as f:
        assert f.read(2) == b"\x1f\x8b"  # gzip
    raw = pack(data, tmp_path)
    with tarfile.open(raw.path, mode="r:") as tar:  # a plain tar
        assert tar.getnames() == ["weights.bin"]
    assert raw.size < 2**20 + 16 * 2**10  # headers and the last record


def test_executable_bits_are_kept(tmp_path: Path) -> None:
    top = tree(tmp_path / "p", {"run.sh": "#!/bin/sh\n", "lib.py": ""})
    (top / "run.sh").chmod(0o700)
    with tarfile.open(pack(top, tmp_path).path) as tar:
        modes = {m.name: m.mode for m in tar.getmembers()}
    assert modes == {"lib.py": 0o644, "run.sh": 0o755}


def test_links_inside_are_kept_and_links_out_refused(tmp_path: Path) -> None:
    top = tree(tmp_path / "p", {"real.py": ""})
    (top / "alias.py").symlink_to("real.py")
    with tarfile.open(pack(top, tmp_path).path) as tar:
        link = tar.getmember("alias.py")
    assert link.issym() and link.linkname == "real.py"
    (top / "escape").symlink_to("../../etc")
    with pytest.raises(PackageError, match="escape: a symbolic link out of the working dir"):
        pack(top, tmp_path)


def test_a_package_over_the_cap_is_refused_naming_its_size_and_the_cap(tmp_path: Path) -> None:
    top = tmp_path / "p"
    top.mkdir()
    (top / "weights.bin").write_bytes(os.urandom(3 * 2**20))
    with pytest.raises(PackageError) as refused:
        pack(top, tmp_path, max_bytes=2**20)
    message = str(refused.value)
    assert "packs to 3.0 MiB" in message and "above the cap of 1.0 MiB" in message
    assert "\n" not in message
    assert list(tmp_path.glob("arranger-package-*")) == []  # nothing left behind
    (top / "weights.bin").write_bytes(b"\0" * (30 * 2**20))
    with pytest.raises(PackageError, match=r"holds 30.0 MiB in 1 files, far above .* 1.0 MiB"):
        pack(top, tmp_path, max_bytes=2**20)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match="not a directory"):
        pack(tmp_path / "missing", tmp_path)
