"""The CLI's import graph stays small: parsing a client command, and loading the modules that
carry it out, never import the server, the agent, the scheduling core, the simulator or numpy."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("arranger.server", "arranger.agent", "arranger.sched", "arranger.sim", "numpy")


def loaded_after(code: str) -> list[str]:
    """loaded_after: the HEAVY packages (or their modules) in sys.modules after `code` runs in
    a fresh interpreter."""
    probe = (
        f"{code}\n"
        "import sys\n"
        f"heavy = {HEAVY!r}\n"
        "print('\\n'.join(sorted(m for m in sys.modules "
        "if any(m == h or m.startswith(h + '.') for h in heavy))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_parsing_a_client_command_imports_nothing_heavy() -> None:
    code = (
        "import contextlib, io\n"
        "from arranger.client.cli import build_parser\n"
        "parser = build_parser()\n"
        "parser.parse_args(['list', '--queue', 'q'])\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    parser.parse_args(['list', '--help'])\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    parser.parse_args(['--help'])\n"
    )
    assert loaded_after(code) == []


def test_the_client_commands_import_nothing_heavy() -> None:
    code = "import arranger.client.commands, arranger.client.joblist, arranger.client.sdk"
    assert loaded_after(code) == []


def test_the_parser_of_a_daemon_loads_when_it_is_chosen() -> None:
    code = (
        "import contextlib, io\n"
        "from arranger.client.cli import build_parser\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    build_parser().parse_args(['server', '--help'])\n"
    )
    assert "arranger.server.main" in loaded_after(code)
