"""run_command: `arranger run [OPTIONS] -- COMMAND [ARGS...]`, a job submitted without a YAML
file, as `srun` or `ray job submit` take one.

The command is the learner's; `--actors N` adds a worker set `actors` of N pods running
`--actor-command` (or the same command). Each pod asks `--cpu`, `--memory` and `--gpu` (a share
of one GPU below 1). No directory is shipped unless `--working-dir` names one. The job is
built as the file would say it and checked like one (`--set` changes any other field); then it
is submitted as `arranger submit` submits a file, `--wait` and all.

`--sweep NAME=V1,V2` (repeated) and `--seeds N` make it an experiment (spec.sweep): a job per
point of the grid and seed, as a file's `sweep` would; each value is the string typed.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
from typing import Any

from arranger.client.overrides import OverrideError, add_set_arguments, apply_sets
from arranger.client.specfile import SpecFileError, load_job_data

USAGE = "arranger run [OPTIONS] -- COMMAND [ARGS ...]"
EPILOG = """examples:
  arranger run --gpu 0.5 -- python train.py --lr 3e-4
  arranger run --working-dir . --actors 8 --actor-command 'python actor.py' -- python learner.py
  arranger run --name smoke --wait -- python -c 'import torch; print(torch.cuda.is_available())'
  arranger run --sweep lr=1e-4,3e-4 --sweep batch=32,64 --seeds 3 -- python train.py --lr {lr}"""
_NOT_IN_NAME = re.compile(r"[^a-z0-9-]+")
_PARAMETER = re.compile(r"[a-z][a-z0-9_]*")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.usage, p.epilog = USAGE, EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--name", default="", help="the job's name (default: the program's, and 4 hex)")
    p.add_argument("--cpu", default="1", help="cores each pod asks (default 1)")
    p.add_argument("--memory", default="1Gi", help="memory each pod asks (default 1Gi)")
    p.add_argument("--gpu", default="0", help="GPUs each pod asks: 1, 2, or a share like 0.5")
    p.add_argument("--actors", type=int, default=0, metavar="N", help="N actors beside it")
    p.add_argument(
        "--actor-command",
        default="",
        metavar="COMMAND",
        help="the actors' command, one string split as a shell would (default: the same)",
    )
    p.add_argument("--queue", default="", help="the queue (default: the server's default)")
    p.add_argument("--priority", type=int, default=None, help="its priority")
    p.add_argument(
        "--working-dir",
        metavar="DIR",
        default=None,
        help="pack DIR and start every pod in its copy (nothing is shipped without it)",
    )
    add_set_arguments(p, "any other field of the job")
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait until the job ends; exit 0 completed, 1 failed, 3 stopped or deleted",
    )
    p.add_argument(
        "--queue-anyway",
        action="store_true",
        help="queue a job no registered node could ever hold (a node may join)",
    )
    p.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="make an experiment: a job per point of the grid of these values (repeatable) "
        "and seed; each sees {NAME} in its command and $ARRANGER_SWEEP_<NAME> upper-cased "
        "(values as typed, no comma in one)",
    )
    p.add_argument("--seeds", type=int, default=None, metavar="N", help="N jobs a point: {seed}")
    p.add_argument(
        "--max-parallel", type=int, default=None, metavar="N", help="at most N members at once"
    )
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")


def job_document(args: argparse.Namespace) -> dict[str, Any]:
    """job_document: the job the options describe, shaped as its YAML file would be."""
    command = list(args.command)
    resources: dict[str, Any] = {"cpu": args.cpu, "memory": args.memory}
    if args.gpu not in ("", "0"):
        resources["gpu"] = args.gpu
    spec: dict[str, Any] = {
        "leader": {
            "name": "learner",
            "template": {"command": command, "resources": dict(resources)},
        },
        "workerSets": [],
    }
    if args.actors > 0:
        actor = shlex.split(args.actor_command) if args.actor_command else command
        spec["workerSets"] = [
            {
                "name": "actors",
                "counts": args.actors,
                "template": {"command": actor, "resources": dict(resources)},
            }
        ]
    if args.priority is not None:
        spec["priority"] = args.priority
    sweep = sweep_document(args)
    if sweep is not None:
        spec["sweep"] = sweep
    metadata = {"name": args.name or default_name(command)}
    if args.queue:
        metadata["queue"] = args.queue
    return {"apiVersion": "arranger/v1", "kind": "TYJob", "metadata": metadata, "spec": spec}


def sweep_document(args: argparse.Namespace) -> dict[str, Any] | None:
    """sweep_document: spec.sweep as `--sweep`, `--seeds` and `--max-parallel` say it (None
    without --sweep or --seeds), each value the string typed; a SpecFileError names a flag
    that breaks its rule."""
    if not args.sweep and args.seeds is None:
        if args.max_parallel is not None:
            raise SpecFileError("arranger run", ["--max-parallel: only with --sweep or --seeds"])
        return None
    parameters: dict[str, list[str]] = {}
    problems = [
        f"--sweep {text!r}: {why}" for text in args.sweep for why in _parameter(text, parameters)
    ]
    if args.seeds is not None and args.seeds < 1:
        problems.append(f"--seeds {args.seeds}: must be 1 or more")
    if args.max_parallel is not None and args.max_parallel < 0:
        problems.append(f"--max-parallel {args.max_parallel}: must be 0 (no limit) or more")
    if problems:
        raise SpecFileError("arranger run", problems)
    sweep: dict[str, Any] = {"parameters": parameters}
    if args.seeds is not None:
        sweep["seeds"] = args.seeds
    if args.max_parallel is not None:
        sweep["maxParallel"] = args.max_parallel
    return sweep


def _parameter(text: str, parameters: dict[str, list[str]]) -> list[str]:
    """_parameter adds the parameter `text` (NAME=V1,V2,...) to `parameters`, or says why
    it cannot."""
    name, found, values = text.partition("=")
    if not found:
        return ["give NAME=V1,V2,... (e.g. --sweep lr=1e-4,3e-4)"]
    if not _PARAMETER.fullmatch(name):
        return [f"the name {name!r} must be a lowercase letter, then letters, digits or _"]
    if name in parameters:
        return [f"{name} is given twice: give its values in one --sweep"]
    split = values.split(",")
    if not values or "" in split:
        return ["every value must be non-empty (values are comma-separated)"]
    parameters[name] = split
    return []


def default_name(command: list[str]) -> str:
    """default_name: the program's name as a job name may spell it, and 4 random hex digits
    (so a command run twice makes two jobs)."""
    program = _NOT_IN_NAME.sub("-", os.path.basename(command[0]).lower()).strip("-")[:40]
    return f"{program or 'run'}-{secrets.token_hex(2)}"


def cmd_run(args: argparse.Namespace) -> int:
    from arranger.client.commands import submit_spec  # noqa: PLC0415

    if args.actors < 0:
        raise SpecFileError("arranger run", ["--actors: must be >= 0"])
    try:
        doc = apply_sets(job_document(args), args.sets)
    except OverrideError as exc:
        raise SpecFileError("arranger run", [str(exc)]) from None
    spec = load_job_data(doc, "arranger run")
    return submit_spec(args, spec, args.working_dir)
