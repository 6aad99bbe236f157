"""listing_args: the flags of `arranger list` and `arranger get`, added when one of them is
chosen (see parser's LazyParser). It imports nothing heavy: parsing `list` costs argparse."""

from __future__ import annotations

import argparse

from arranger.client.parser import stage_name
from arranger.states import Stage


def add_list_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queue", default="", help="only jobs of this queue")
    p.add_argument(
        "--stage",
        action="append",
        default=[],
        type=stage_name,
        metavar="STAGE",
        help=f"only jobs in this stage, in any case (repeatable): {', '.join(Stage)}",
    )
    p.add_argument(
        "--all", action="store_true", help="finished jobs too (without it, unfinished ones only)"
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument("--user", default="", metavar="USER", help="only this user's jobs")
    who.add_argument("--mine", action="store_true", help="only your jobs")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--expand",
        action="store_true",
        help="list experiments' members as jobs (without it, an experiment with a member in "
        "the stages listed is one line; -o json|yaml always lists the members)",
    )
    which.add_argument(
        "--experiment",
        default="",
        metavar="NAME",
        help="only this experiment's members (name or id), in every stage unless --stage",
    )
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")


def add_get_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", metavar="NAME", help="job or experiment, by name or id")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml", "csv"),
        default="table",
        help="an experiment's json|yaml: its summary's fields, `columns` and `rows` (one per "
        "member, keyed by column; elapsed in seconds); csv (an experiment only): a header, then "
        "a row per member",
    )
    p.add_argument(
        "--sort",
        default="",
        metavar="COLUMN",
        help="an experiment's members sorted by a column (index, name, a parameter, seed, "
        "stage, outcome, elapsed, exit_code, step, a reported key); --sort=-COLUMN "
        "descending; members without a value last",
    )
