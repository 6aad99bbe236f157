"""Every command says its release: the CLI, the server and the agent."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import arranger
from arranger.agent.main import main as agent_main
from arranger.client.cli import main as cli_main
from arranger.server.main import main as server_main


@pytest.mark.parametrize(
    ("name", "main"),
    [("arranger", cli_main), ("arranger-server", server_main), ("arranger-agent", agent_main)],
)
def test_each_command_says_its_release(
    name: str, main: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"{name} {arranger.__version__}\n"
