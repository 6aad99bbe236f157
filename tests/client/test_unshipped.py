"""unshipped_files: the warning of a submit whose command names a file of the current directory
that nothing ships to the pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from arranger.client.package import unshipped_files
from arranger.client.specfile import load_job_data
from arranger.v1 import job_pb2


def job(leader: list[str], worker: list[str] | None = None, **spec: object) -> job_pb2.TYJob:
    body: dict[str, object] = {"leader": {"name": "l", "template": {"command": leader}}, **spec}
    if worker is not None:
        body["workerSets"] = [{"name": "w", "counts": 1, "template": {"command": worker}}]
    return load_job_data({"metadata": {"name": "j"}, "spec": body})


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """here: a current directory holding train.py and run.sh, with a PATH of its own."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "tool").write_text("a local file named as a program on PATH\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(bin_dir))
    return tmp_path


def test_a_local_file_without_a_working_dir_is_warned_of(here: Path) -> None:
    assert unshipped_files(job(["python", "train.py"], ["./run.sh", "--fast"]), None) == [
        "spec.leader.template.command names train.py, which is in this directory but no "
        "workingDir ships it; add `workingDir: .`",
        "spec.workerSets[0].template.command names ./run.sh, which is in this directory but "
        "no workingDir ships it; add `workingDir: .`",
    ]


def test_args_are_words_of_the_command_too(here: Path) -> None:
    spec = job(["python"])
    spec.spec.leader.template.args.append("train.py")
    assert [w.split(" names ")[0] for w in unshipped_files(spec, None)] == [
        "spec.leader.template.args"
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["python", "missing.py"],  # not here
        ["tool"],  # found on PATH: it runs from there
        ["/bin/sh", "/abs/train.py"],
        ["python", "."],  # a directory, not a file
    ],
)
def test_words_that_name_no_local_file_are_not_warned_of(here: Path, command: list[str]) -> None:
    assert unshipped_files(job(command), None) == []


def test_a_working_dir_anywhere_silences_it(here: Path) -> None:
    local = job(["python", "train.py"])
    assert unshipped_files(local, here) == []  # --working-dir, or spec.workingDir
    assert unshipped_files(local, ".") == []
    shipped = job(["python", "train.py"], workingDir=".")
    assert unshipped_files(shipped, None) == []
    own = job(["python", "train.py"])
    own.spec.leader.template.working_dir = "/shared/code"  # the pod starts where it lies
    assert unshipped_files(own, None) == []


def test_warnings_are_few_however_many_words(here: Path) -> None:
    assert len(unshipped_files(job(["python"] + ["./train.py"] * 3), None)) == 1
    many = job(["sh", *(f"f{i}" for i in range(20))])
    for i in range(20):
        (here / f"f{i}").write_text("")
    assert len(unshipped_files(many, None)) == 5
