"""fragmentation: the FGD paper's experiment on every openb pod list, for the paper's baselines
and our own basicPolicies, and the report bench/fragmentation.md.

Every trace ../shared/traces/alibaba-gpu-v2023/openb_pod_list_*.csv (on the GPU node list) x
policies (Random, DotProd, GpuPacking, BestFit, FGD, MinFragment, BinPack) x seeds 42-51, one
`arranger simulate` run each, in parallel processes. The report gets, between its "generated"
markers (the rest of the file is kept as written): the default trace's medians next to the
published ones, median and spread (min-max) of unallocated GPU % at arrived = 100 % per trace x
policy, the machine, the date and the time taken; and bench/fragmentation.png, unallocated vs
arrived on the default trace.

    python bench/fragmentation.py                          # everything (2 processes)
    python bench/fragmentation.py --only default --only cpu050 --cache /tmp/frag.jsonl

--cache keeps every finished run (JSON lines) and reuses it: a long run can be resumed, and the
report is written from all the runs in the cache that match the traces, policies and seeds asked.

--gpuspec-family runs the gpuspec family instead: the default trace with 0, 5, ... 50 % of its
GPU pods bound to a GPU model (`arranger simulate --gpuspec-ratio`), FGD and MinFragment by
default, and writes its own section of the report (between the "gpuspec" markers):

    python bench/fragmentation.py --gpuspec-family --cache /tmp/frag.jsonl
    python bench/fragmentation.py --gpuspec-family --ratio 0.3 --ratio 0.5 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from arranger.sim.gpuspec import gpuspec_name
from arranger.sim.main import plot_curves
from arranger.sim.protocol import POINTS, Result, Task, run_task

HERE = Path(__file__).resolve().parent
TRACES = HERE.parent.parent / "shared" / "traces" / "alibaba-gpu-v2023"
NODES_FILE = "openb_node_list_gpu_node.csv"
POLICIES = ("Random", "DotProd", "GpuPacking", "BestFit", "FGD", "MinFragment", "BinPack")
SEEDS = tuple(range(42, 52))
DEFAULT = "default"
START, END = "<!-- generated:start -->", "<!-- generated:end -->"
FAMILY_START, FAMILY_END = "<!-- gpuspec:start -->", "<!-- gpuspec:end -->"
FAMILY_RATIOS = tuple(i / 20 for i in range(11))  # 0, 5, ... 50 % of the GPU pods
FAMILY_POLICIES = ("FGD", "MinFragment")
# Quoted from ../shared/traces/README.md (the paper's artifact): medians over seeds 42-51 on
# openb_pod_list_default, unallocated GPU % at arrived 80 ... 130 %.
PUBLISHED = {
    "Random": (21.24, 14.97, 14.32, 13.75, 13.23, 12.84, 12.62),
    "DotProd": (19.99, 10.02, 9.48, 9.45, 9.37, 9.29, 9.20),
    "GpuPacking": (19.99, 10.00, 8.23, 8.20, 8.12, 8.05, 7.94),
    "BestFit": (19.99, 9.99, 7.14, 7.09, 7.02, 6.96, 6.89),
    "FGD": (19.99, 10.00, 5.09, 4.77, 4.68, 4.63, 4.60),
}
# Means at arrived 100 % on two variants, same source.
PUBLISHED_MEANS = {
    "cpu050": {"Random": 10.98, "DotProd": 6.97, "GpuPacking": 6.54, "BestFit": 6.44, "FGD": 5.00},
    "gpushare40": {
        "Random": 15.14,
        "DotProd": 10.70,
        "GpuPacking": 10.23,
        "BestFit": 8.56,
        "FGD": 6.04,
    },
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=TRACES, help=f"(default {TRACES})")
    parser.add_argument(
        "--only",
        action="append",
        metavar="VARIANT",
        help="default, cpu050, ... (repeatable; default all)",
    )
    parser.add_argument(
        "--policy", action="append", help=f"(repeatable; default {', '.join(POLICIES)})"
    )
    parser.add_argument(
        "--seeds", type=int, default=len(SEEDS), help="how many seeds from 42 (default 10)"
    )
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--cache", type=Path, help="JSON lines of finished runs, reused and extended"
    )
    parser.add_argument("--report", type=Path, default=HERE / "fragmentation.md")
    parser.add_argument(
        "--gpuspec-family",
        action="store_true",
        help="run the gpuspec family of the default trace instead of the pod lists",
    )
    parser.add_argument(
        "--ratio", action="append", type=float, help="with --gpuspec-family (default 0-0.5)"
    )
    args = parser.parse_args(argv)
    if args.gpuspec_family:
        return family(args, argv)

    nodes = args.traces / NODES_FILE
    pods = sorted(args.traces.glob("openb_pod_list_*.csv"))
    if args.only:
        pods = [p for p in pods if variant(p.stem) in args.only]
    if not nodes.is_file() or not pods:
        print(f"error: no node list or pod lists under {args.traces}", file=sys.stderr)
        return 1
    policies = tuple(args.policy or POLICIES)
    seeds = tuple(range(42, 42 + args.seeds))
    tasks = [Task(nodes, p, name, seed) for p in pods for name in policies for seed in seeds]

    results, ran, wall = run_tasks(tasks, args.cache, args.processes)
    plot = args.report.with_suffix(".png")
    default = [r for r in results if variant(r.pods_name) == DEFAULT]
    if default:
        title = f"openb default, seeds {seeds[0]}-{seeds[-1]}: median, min-max band"
        plot_curves(default, plot, title)
    command = " ".join(
        ["python bench/fragmentation.py", *(argv if argv is not None else sys.argv[1:])]
    )
    write_report(
        args.report,
        report(
            results,
            policies,
            seeds,
            command,
            wall,
            ran,
            args.processes,
            plot if default else None,
        ),
    )
    print(f"wrote {args.report} ({wall / 60:.1f} min)")
    return 0


def run_tasks(
    tasks: Sequence[Task], cache: Path | None, processes: int
) -> tuple[list[Result], int, float]:
    """run_tasks: the tasks' results, from the cache or run (and added to it); how many ran,
    and the wall time in seconds."""
    cached = load_cache(cache)
    todo = [t for t in tasks if key(t) not in cached]
    start = time.perf_counter()
    print(f"{len(tasks)} runs, {len(tasks) - len(todo)} cached, {processes} processes", flush=True)
    with ProcessPoolExecutor(max_workers=max(1, processes)) as pool:
        futures = {pool.submit(run_task, t): t for t in todo}
        for done, future in enumerate(as_completed(futures), start=1):
            result = future.result()
            cached[key(futures[future])] = result
            save(cache, result)
            print(
                f"[{done}/{len(todo)}] {result.pods_name} {result.policy} {result.seed}: "
                f"{result.unallocated['100']} % ({result.seconds:.1f} s)",
                flush=True,
            )
    return [cached[key(t)] for t in tasks], len(todo), time.perf_counter() - start


def family(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """family runs the gpuspec family and writes its section of the report."""
    nodes, pods = args.traces / NODES_FILE, args.traces / f"openb_pod_list_{DEFAULT}.csv"
    if not nodes.is_file() or not pods.is_file():
        print(f"error: no node list or default pod list under {args.traces}", file=sys.stderr)
        return 1
    ratios = tuple(args.ratio or FAMILY_RATIOS)
    policies = tuple(args.policy or FAMILY_POLICIES)
    seeds = tuple(range(42, 42 + args.seeds))
    tasks = [
        Task(nodes, pods, name, seed, gpuspec_ratio=ratio)
        for ratio in ratios
        for name in policies
        for seed in seeds
    ]
    results, ran, wall = run_tasks(tasks, args.cache, args.processes)
    command = " ".join(
        ["python bench/fragmentation.py", *(argv if argv is not None else sys.argv[1:])]
    )
    lines = [
        f"Generated {time.strftime('%Y-%m-%d')} by `{command}`: {len(results)} runs "
        f"({len(ratios)} ratios x {len(policies)} policies x seeds {seeds[0]}-{seeds[-1]}); "
        f"the runs' own times add up to {sum(r.seconds for r in results) / 60:.1f} min, "
        f"{ran} ran in this invocation ({wall / 60:.1f} min wall time on {args.processes} "
        "processes).",
        "",
        f"Machine: {machine()}.",
        "",
        *family_table(results, ratios, policies),
    ]
    write_report(args.report, "\n".join(lines), FAMILY_START, FAMILY_END)
    print(f"wrote {args.report} ({wall / 60:.1f} min)")
    return 0


def family_table(
    results: Sequence[Result], ratios: Sequence[float], policies: Sequence[str]
) -> list[str]:
    """family_table: per ratio, each policy's median (min-max) unallocated GPU % at arrived
    100 %, and how many seeds MinFragment leaves less than FGD on."""
    at: dict[tuple[str, str], dict[int, float]] = {}
    for r in results:
        if (value := r.unallocated["100"]) is not None:
            at.setdefault((r.pods_name, r.policy), {})[r.seed] = value
    lines = [
        "| bound to a model | "
        + " | ".join(f"{name} median (min-max)" for name in policies)
        + " | MinFragment better on |",
        "|---|" + "---|" * (len(policies) + 1),
    ]
    base = f"openb_pod_list_{DEFAULT}"
    for ratio in ratios:
        trace = gpuspec_name(base, ratio)
        cells = []
        for name in policies:
            values = list(at.get((trace, name), {}).values())
            if not values:
                cells.append("-")
                continue
            med, lo, hi = spread(values)
            cells.append(f"{med:.2f} ({lo:.2f}-{hi:.2f})")
        ours, theirs = at.get((trace, "MinFragment"), {}), at.get((trace, "FGD"), {})
        both = [s for s in ours if s in theirs]
        better = f"{sum(ours[s] < theirs[s] for s in both)}/{len(both)}" if both else "-"
        lines.append(f"| {round(ratio * 100)} % | " + " | ".join(cells) + f" | {better} |")
    return lines


def variant(stem: str) -> str:
    return stem.removeprefix("openb_pod_list_")


def key(task: Task) -> tuple[str, str, int, float]:
    name = task.pods_csv.stem
    if task.gpuspec_ratio is not None:
        name = gpuspec_name(name, task.gpuspec_ratio)
    return (name, task.policy, task.seed, task.inflate)


def load_cache(path: Path | None) -> dict[tuple[str, str, int, float], Result]:
    if path is None or not path.is_file():
        return {}
    results = [Result.from_json(json.loads(line)) for line in path.read_text().splitlines() if line]
    return {(r.pods_name, r.policy, r.seed, r.inflate): r for r in results}


def save(path: Path | None, result: Result) -> None:
    if path is not None:
        with path.open("a") as f:
            f.write(json.dumps(result.to_json(curve=True)) + "\n")


def spread(values: Iterable[float]) -> tuple[float, float, float]:
    v = list(values)
    return statistics.median(v), min(v), max(v)


def report(
    results: Sequence[Result],
    policies: Sequence[str],
    seeds: Sequence[int],
    command: str,
    wall: float,
    ran: int,
    processes: int,
    plot: Path | None,
) -> str:
    """report: the generated part of bench/fragmentation.md."""
    traces = list(dict.fromkeys(r.pods_name for r in results))
    at: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        at.setdefault((r.pods_name, r.policy), []).append(r)
    total = sum(r.seconds for r in results) / 60
    lines = [
        f"Generated {time.strftime('%Y-%m-%d')} by `{command}`: {len(results)} runs "
        f"({len(traces)} traces x {len(policies)} policies x seeds {seeds[0]}-{seeds[-1]}); "
        f"the runs' own times add up to {total:.1f} min. {ran} ran in this invocation, "
        f"{wall / 60:.1f} min wall time on {processes} processes (the others came from the cache).",
        "",
        f"Machine: {machine()}.",
        "",
    ]
    default = next((t for t in traces if variant(t) == DEFAULT), None)
    if default:
        lines += [
            "### Default trace: our medians and the published ones",
            "",
            "Unallocated GPU % at each arrived %, median over the seeds (published: the paper's "
            "artifact, as quoted in ../shared/traces/README.md).",
            "",
            "| policy | " + " | ".join(f"{p} %" for p in POINTS) + " | s/run |",
            "|---|" + "---|" * (len(POINTS) + 1),
        ]
        for name in policies:
            runs = at.get((default, name), [])
            if not runs:
                continue
            ours = [
                statistics.median(v for r in runs if (v := r.unallocated[str(p)]) is not None)
                for p in POINTS
            ]
            seconds = statistics.median(r.seconds for r in runs)
            lines.append(
                f"| {name} | " + " | ".join(f"{o:.2f}" for o in ours) + f" | {seconds:.1f} |"
            )
            if name in PUBLISHED:
                lines.append(
                    f"| *{name}, published* | "
                    + " | ".join(f"*{v:.2f}*" for v in PUBLISHED[name])
                    + " | |"
                )
        frag = [
            f"{name} {statistics.median(r.fragmentation['100'] or 0.0 for r in at[(default, name)]):.1f}"
            for name in policies
            if (default, name) in at
        ]
        lines += [
            "",
            "Fragmentation rate at arrived 100 % (FGD's measure, % of free GPU), median: "
            + ", ".join(frag)
            + ".",
            "",
        ]
        if plot is not None:
            lines += [f"![unallocated vs arrived, default trace]({plot.name})", ""]
    lines += [
        "### Every trace: unallocated GPU % at arrived = 100 %",
        "",
        "Median over the seeds, (min-max) below it.",
        "",
        "| trace | " + " | ".join(policies) + " |",
        "|---|" + "---|" * len(policies),
    ]
    for trace in traces:
        cells = []
        for name in policies:
            runs = at.get((trace, name), [])
            values = [v for r in runs if (v := r.unallocated["100"]) is not None]
            if not values:
                cells.append("-")
                continue
            med, lo, hi = spread(values)
            cells.append(f"{med:.2f}<br>({lo:.2f}-{hi:.2f})")
        lines.append(f"| {variant(trace)} | " + " | ".join(cells) + " |")
    lines += against_fgd(traces, at)
    means = []
    for trace in traces:
        published = PUBLISHED_MEANS.get(variant(trace))
        if not published:
            continue
        for name, value in published.items():
            runs = at.get((trace, name), [])
            if runs:
                mean = statistics.mean(r.unallocated["100"] or 0.0 for r in runs)
                means.append(f"{variant(trace)} {name} {mean:.2f} (published {value:.2f})")
    if means:
        lines += [
            "",
            "Means at arrived 100 % where the paper gives means: " + "; ".join(means) + ".",
        ]
    return "\n".join(lines)


def against_fgd(traces: Sequence[str], at: dict[tuple[str, str], list[Result]]) -> list[str]:
    """against_fgd: per trace, MinFragment's median and seed-by-seed difference to FGD's."""
    rows = []
    for trace in traces:
        ours = {r.seed: r.unallocated["100"] for r in at.get((trace, "MinFragment"), [])}
        theirs = {r.seed: r.unallocated["100"] for r in at.get((trace, "FGD"), [])}
        seeds = sorted(s for s in ours if ours[s] is not None and theirs.get(s) is not None)
        if not seeds:
            continue
        mine = statistics.median(ours[s] or 0.0 for s in seeds)
        fgd = statistics.median(theirs[s] or 0.0 for s in seeds)
        diffs = [(ours[s] or 0.0) - (theirs[s] or 0.0) for s in seeds]
        better = sum(d < 0 for d in diffs)
        rows.append(
            f"| {variant(trace)} | {mine:.2f} | {fgd:.2f} | {100 * (fgd - mine) / fgd:.0f} % "
            f"| {better}/{len(seeds)} | {max(diffs):+.2f} |"
        )
    if not rows:
        return []
    return [
        "",
        "### MinFragment against FGD, arrived = 100 %",
        "",
        "Medians over the seeds; fewer wasted: how much of FGD's unallocated GPU MinFragment "
        "saves; better on: seeds where MinFragment leaves less unallocated than FGD with the same "
        "seed (the same arrivals); worst: the largest MinFragment - FGD difference of one seed.",
        "",
        "| trace | MinFragment | FGD | fewer wasted | better on | worst |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def machine() -> str:
    memory = ""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        kib = int(meminfo.read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB"
    system = platform.platform(terse=True)
    os_release = Path("/etc/os-release")
    if os_release.is_file():
        for line in os_release.read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                system = line.split("=", 1)[1].strip('"')
    cpu = platform.processor() or "cpu"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            ln.split(":", 1)[1].strip()
            for ln in cpuinfo.read_text().splitlines()
            if ln.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    return (
        f"{platform.machine()}, {os.cpu_count()} cores ({cpu}){memory}, "
        f"{system}, Python {platform.python_version()}"
    )


def write_report(path: Path, generated: str, start: str = START, end: str = END) -> None:
    """write_report replaces the part of the report between the markers, keeping the rest
    (the markers are appended if the report lacks them)."""
    text = path.read_text() if path.is_file() else "# Fragmentation benchmark\n"
    if start not in text or end not in text:
        text += f"\n{start}\n{end}\n"
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{start}\n{generated}\n{end}{tail}")


if __name__ == "__main__":
    sys.exit(main())
