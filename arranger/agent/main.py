"""main is the arranger-agent command (also `arranger agent`)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from arranger import __version__, logsetup
from arranger.agent.agent import Agent
from arranger.agent.config import (
    AgentConfig,
    AgentConfigError,
    check_pods_not_root,
    load_agent_config,
    pod_user,
)
from arranger.agent.fence import AgentRunning
from arranger.signals import until_stop_signal


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML settings file (see arranger/agent/config.py)")
    p.add_argument("--server", dest="agent_server", help="arranger-server address, HOST:PORT")
    p.add_argument("--node-name", help="this node's name (default: the host name)")
    p.add_argument("--address", help="address other machines reach this node's pods at")
    p.add_argument("--data-dir", type=Path, help="where logs and scratch directories live")
    p.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="node label (repeatable)"
    )
    p.add_argument(
        "--fake-gpus", type=int, help="declare this many fake GPUs (for trying GPU jobs)"
    )
    p.add_argument("--user", help="run pods as this user (the agent must be root to switch)")
    p.add_argument(
        "--run-as", choices=("owner",), help="run each pod as its job owner's account (as root)"
    )
    p.add_argument(
        "--run-as-root",
        action="store_true",
        default=None,
        help="an agent running as root may run its pods as root",
    )
    p.add_argument(
        "--stop-pods",
        action="store_true",
        default=None,
        help="stop every pod when the agent exits (default: they run on for the next agent)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument(
        "--log-format",
        default=os.environ.get("ARRANGER_LOG_FORMAT", "text"),
        choices=logsetup.FORMATS,
        help="text: key=value lines; json: one object a line (default $ARRANGER_LOG_FORMAT or text)",
    )
    p.set_defaults(handler=cmd_agent)


def cmd_agent(args: argparse.Namespace) -> int:
    logsetup.configure(args.log_level, args.log_format)
    try:
        labels = dict(item.split("=", 1) for item in args.label)
    except ValueError:
        print("error: --label wants KEY=VALUE", file=sys.stderr)
        return 1
    try:
        config = load_agent_config(
            args.config,
            server=args.agent_server,
            node_name=args.node_name,
            address=args.address,
            data_dir=args.data_dir,
            fake_gpus=args.fake_gpus,
            user=args.user,
            run_as=args.run_as,
            run_as_root=args.run_as_root,
            stop_pods_on_exit=args.stop_pods,
        )
        check_pods_not_root(config)
        pod_user(config)  # refuse now what the agent could not do later
    except AgentConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if labels:
        config = dataclasses.replace(config, labels={**config.labels, **labels})
    asyncio.run(run_agent(config))
    return 0


async def run_agent(config: AgentConfig) -> None:
    """run_agent serves until SIGINT or SIGTERM, which stop the agent alone: its pods run on
    for the next agent to adopt (unless stop_pods_on_exit)."""
    agent = Agent(config)
    try:
        agent.start()
    except AgentRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        await until_stop_signal()
    finally:
        await agent.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arranger-agent", description="Run arranger-agent.")
    parser.add_argument("--version", action="version", version=f"arranger-agent {__version__}")
    add_agent_arguments(parser)
    return cmd_agent(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
