"""`arranger simulate` through its argument parser, on tiny CSV files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from arranger.sim.main import add_simulate_arguments

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\nn1,32000,65536,2,T4\n"
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
    f"p{i},4000,1024,1,{500 if i % 2 else 1000}\n" for i in range(6)
)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="arranger simulate")
    add_simulate_arguments(parser)
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    (tmp_path / "openb_pod_list_default.csv").write_text(PODS)
    return tmp_path


def test_one_run_prints_its_object(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--traces", str(traces), "--policy", "FGD", "--seed", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["policy"], out["seed"], out["pods"], out["gpus"]) == (
        "FGD",
        5,
        "openb_pod_list_default",
        4.0,
    )
    assert set(out["unallocated_gpu_pct"]) == {"80", "90", "95", "100", "110", "120", "130"}
    assert out["pods_placed"] + out["pods_dropped"] == out["pods_arrived"]


def test_several_runs_and_a_table(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--traces",
        str(traces),
        "--policy",
        "BestFit",
        "--policy",
        "MinFragment",
        "--seed",
        "1",
        "--seed",
        "2",
    ]
    assert run(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["policy"], r["seed"]) for r in out["runs"]] == [
        ("BestFit", 1),
        ("BestFit", 2),
        ("MinFragment", 1),
        ("MinFragment", 2),
    ]
    assert set(out["median_unallocated_gpu_pct"]) == {"BestFit", "MinFragment"}
    assert run([*argv, "-o", "table"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2].split()[:2] == ["BestFit", "2"]


def test_a_missing_file_is_one_line(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--traces", str(traces), "--pods", str(traces / "absent.csv")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --pods: no such file:") and "\n" not in err


def test_an_unknown_policy_is_one_line(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--traces", str(traces), "--policy", "Tetris"]) == 1
    assert "unknown policy 'Tetris'" in capsys.readouterr().err


def test_plot_writes_a_png(traces: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "u.png"
    assert run(["--traces", str(traces), "--policy", "Random", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_arranger_cli_has_simulate(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from arranger.client.parser import build_parser  # noqa: PLC0415

    args = build_parser().parse_args(["simulate", "--traces", str(traces), "--policy", "BestFit"])
    assert args.handler(args) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "BestFit"


def test_gpuspec_ratio_runs_the_family_member(
    traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["--traces", str(traces), "--gpuspec-ratio", "0.5", "--seed", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pods"] == "openb_pod_list_default+gpuspec50"
    assert out["pods_placed"] + out["pods_dropped"] == out["pods_arrived"]


def test_a_gpuspec_ratio_above_one_is_one_line(
    traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["--traces", str(traces), "--gpuspec-ratio", "2"]) == 1
    assert "--gpuspec-ratio must be within 0..1" in capsys.readouterr().err
