"""main is `arranger simulate`: replay an openb trace through the scheduling core and print the
result, as JSON (one run: its object; several: {"runs": [...], "median_unallocated_gpu_pct":
{policy: {point: median over seeds}}}) or as a table of medians over seeds.

    arranger simulate --policy FGD --policy MinFragment --seed 42 --seed 43 -o table
    arranger simulate --pods other.csv --plot unallocated.png
    arranger simulate --gpuspec-ratio 0.25 --policy FGD --policy MinFragment -o table

Files default to the openb GPU node list and default pod list under --traces. Mistakes (a
missing file, an unknown policy, no matplotlib for --plot) print one line and exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from arranger.sim.protocol import (
    GPUSPEC_SEED,
    INFLATE,
    POINTS,
    Result,
    Task,
    UnknownPolicy,
    policy,
    run_all,
)
from arranger.sim.trace import TraceError

DEFAULT_TRACES = Path("../shared/traces/alibaba-gpu-v2023")
NODES_FILE = "openb_node_list_gpu_node.csv"
PODS_FILE = "openb_pod_list_default.csv"
DEFAULT_POLICY = "MinFragment"
DEFAULT_SEED = 42


class SimulateError(ValueError):
    """SimulateError is a user mistake, said in one line."""


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--traces",
        type=Path,
        default=DEFAULT_TRACES,
        metavar="DIR",
        help=f"directory of the openb CSV files (default {DEFAULT_TRACES}, from the current directory)",
    )
    parser.add_argument(
        "--nodes", type=Path, metavar="CSV", help=f"node list (default DIR/{NODES_FILE})"
    )
    parser.add_argument(
        "--pods", type=Path, metavar="CSV", help=f"pod list (default DIR/{PODS_FILE})"
    )
    parser.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="Random, DotProd, GpuPacking, BestFit, FGD (the paper's baselines) or a basicPolicy "
        f"(MinFragment, BinPack, ...); repeat for several (default {DEFAULT_POLICY})",
    )
    parser.add_argument(
        "--seed",
        action="append",
        type=int,
        metavar="N",
        help=f"shuffle and policy seed; repeat for several (default {DEFAULT_SEED})",
    )
    parser.add_argument(
        "--inflate",
        type=float,
        default=INFLATE,
        metavar="X",
        help=f"pods arrive until they ask for X times the cluster's GPUs (default {INFLATE})",
    )
    parser.add_argument(
        "--gpuspec-ratio",
        type=float,
        metavar="R",
        help="constrain this share (0..1) of the GPU pods to one GPU model each, drawn from the "
        "node list as the FGD paper's gpuspec traces are (default: the pod list as it is)",
    )
    parser.add_argument(
        "--gpuspec-seed",
        type=int,
        default=GPUSPEC_SEED,
        metavar="N",
        help=f"seed of the pods and models --gpuspec-ratio draws (default {GPUSPEC_SEED})",
    )
    parser.add_argument("-o", "--output", choices=("json", "table"), default="json")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="plot unallocated vs arrived (needs matplotlib)",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="worker processes (default 1)"
    )
    parser.set_defaults(handler=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    """cmd_simulate runs every policy x seed asked for and prints the results."""
    try:
        tasks = _tasks(args)
        results = run_all(tasks, max(1, args.jobs))
        if args.plot is not None:
            plot_curves(results, args.plot, f"{results[0].pods_name} on {results[0].nodes_name}")
    except (SimulateError, TraceError, UnknownPolicy, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(render_table(results) if args.output == "table" else render_json(results))
    return 0


def _tasks(args: argparse.Namespace) -> list[Task]:
    nodes: Path = args.nodes or args.traces / NODES_FILE
    pods: Path = args.pods or args.traces / PODS_FILE
    for option, path in (("--nodes", nodes), ("--pods", pods)):
        if not path.is_file():
            raise SimulateError(f"{option}: no such file: {path.absolute()}")
    if args.inflate <= 0:
        raise SimulateError(f"--inflate must be above 0, not {args.inflate}")
    ratio: float | None = args.gpuspec_ratio
    if ratio is not None and not 0.0 <= ratio <= 1.0:
        raise SimulateError(f"--gpuspec-ratio must be within 0..1, not {ratio}")
    names = [policy(name).name for name in args.policy or [DEFAULT_POLICY]]
    seeds: list[int] = args.seed or [DEFAULT_SEED]
    return [
        Task(nodes, pods, name, seed, args.inflate, ratio, args.gpuspec_seed)
        for name in names
        for seed in seeds
    ]


def medians(results: Sequence[Result]) -> dict[str, dict[str, float | None]]:
    """medians: per policy, the median over its runs of unallocated % at each point."""
    out: dict[str, dict[str, float | None]] = {}
    for name in dict.fromkeys(r.policy for r in results):
        runs = [r for r in results if r.policy == name]
        out[name] = {}
        for point in map(str, POINTS):
            values = [v for r in runs if (v := r.unallocated[point]) is not None]
            out[name][point] = round(statistics.median(values), 2) if values else None
    return out


def render_json(results: Sequence[Result]) -> str:
    if len(results) == 1:
        return json.dumps(results[0].to_json(), indent=2)
    body = {"runs": [r.to_json() for r in results], "median_unallocated_gpu_pct": medians(results)}
    return json.dumps(body, indent=2)


def render_table(results: Sequence[Result]) -> str:
    """render_table: per policy, median unallocated % over seeds at each arrived %."""
    first = results[0]
    lines = [
        f"{first.pods_name} on {first.nodes_name} ({first.capacity_gpus:g} GPUs), "
        "unallocated GPU % at arrived %, median over seeds",
        f"{'policy':<12} {'seeds':>5} " + " ".join(f"{p:>6}" for p in POINTS) + f" {'s/run':>6}",
    ]
    for name, row in medians(results).items():
        runs = [r for r in results if r.policy == name]
        cells = " ".join(f"{v:>6.2f}" if v is not None else f"{'-':>6}" for v in row.values())
        seconds = statistics.median(r.seconds for r in runs)
        lines.append(f"{name:<12} {len(runs):>5} {cells} {seconds:>6.1f}")
    return "\n".join(lines)


def plot_curves(results: Sequence[Result], path: Path, title: str) -> None:
    """plot_curves draws, per policy, the median unallocated % over seeds against arrived %
    (the band: min to max over seeds)."""
    try:
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")  # files only: no display needed
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        raise SimulateError("--plot needs matplotlib: pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r.policy for r in results):
        curves = [dict(r.curve) for r in results if r.policy == name]
        xs = sorted(set.intersection(*(set(c) for c in curves)))
        xs = [x for x in xs if x >= 60]
        ys = [[c[x] for c in curves] for x in xs]
        ax.plot(xs, [statistics.median(y) for y in ys], label=name, linewidth=1.4)
        ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], alpha=0.2)
    ax.set_xlabel("arrived GPU request, % of cluster GPUs")
    ax.set_ylabel("unallocated GPUs, %")
    ax.set_ylim(0, 30)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
