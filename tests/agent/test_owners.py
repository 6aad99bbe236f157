"""With runAs: owner a root agent runs each pod as its job owner's local account: two users made
for the test each get their pod run as themselves, with a scratch directory (0700) and a log
(0600) of their own; one user's pod cannot read the other's environment, scratch or log, nor
list the directories above them. An owner without an account here, a pod without an owner, and
an owner that is root fail to start, saying why."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from arranger.states import PodState
from tests.agent.rootagent import local_users, needs_root, order, root_agent, shared_dir
from tests.conftest import eventually

pytestmark = pytest.mark.e2e  # a real server, agents and processes

# Bob's pod notes its pid and a secret in its scratch directory, then holds (reading a FIFO)
# until Alice's pod, having tried to read what is Bob's, lets it go.
BOB = (
    'id -u; echo "$$" > {top}/bob.pid; echo "$SECRET" > "$ARRANGER_SCRATCH_DIR/secret"; '
    "echo bob-log-line; cat {top}/go > /dev/null"
)
ALICE = (
    'id -u; try() {{ if cat "$2" >/dev/null 2>&1; then echo "$1 READ $(tr "\\0" " " < "$2")"; '
    'else echo "$1 refused"; fi; }}; '
    'lists() {{ if ls "$2" >/dev/null 2>&1; then echo "$1 LISTED"; else echo "$1 refused"; fi; }}; '
    "pid=$(cat {top}/bob.pid); "
    "{{ try environ /proc/$pid/environ; try scratch {scratch}/secret; try log {log}; "
    "lists scratch-dir {scratch}; lists job-scratch {job_scratch}; lists logs {logs}; "
    "lists pod-logs {pod_logs}; }} > {top}/alice.saw; echo go > {top}/go"
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@needs_root
async def test_each_pod_runs_as_its_owner_and_cannot_read_another_owners_pod() -> None:
    with local_users(2) as (alice, bob), shared_dir() as top:
        (top / "shared").mkdir(mode=0o777)
        shared = top / "shared"
        shared.chmod(0o777)
        os.mkfifo(shared / "go", 0o666)
        (shared / "go").chmod(0o666)
        async with root_agent(top / "node", run_as="owner") as node:
            supervisor = node.agent.supervisor
            node.launch(
                order(
                    "jb/pod",
                    ["/bin/sh", "-c", BOB.format(top=shared)],
                    env={"SECRET": "bobs-secret"},
                    owner=bob.pw_name,
                ),
            )
            await eventually((shared / "bob.pid").exists, 30, "bob's pod to run")
            await eventually(
                (supervisor.files.scratch_dir("jb/pod") / "secret").exists, 30, "its secret"
            )
            probe = ALICE.format(
                top=shared,
                scratch=supervisor.files.scratch_dir("jb/pod"),
                job_scratch=supervisor.files.scratch_dir("jb/pod").parent,
                log=supervisor.files.log_path("jb/pod", 0),
                pod_logs=supervisor.files.log_path("jb/pod", 0).parent,
                logs=supervisor.data_dir / "logs",
            )
            node.launch(order("ja/pod", ["/bin/sh", "-c", probe], owner=alice.pw_name))
            for uid, who in (("ja/pod", alice), ("jb/pod", bob)):
                report = await node.ended(uid)
                assert report.state == PodState.SUCCEEDED, (uid, report, node.log(uid))
                assert node.log(uid).splitlines()[0] == str(who.pw_uid), node.log(uid)
                scratch, log = supervisor.files.scratch_dir(uid), supervisor.files.log_path(uid, 0)
                assert (scratch.stat().st_uid, mode(scratch)) == (who.pw_uid, 0o700)
                assert (log.stat().st_uid, mode(log)) == (who.pw_uid, 0o600)
            saw = (shared / "alice.saw").read_text().splitlines()
            assert saw == [
                "environ refused",
                "scratch refused",
                "log refused",
                "scratch-dir refused",
                "job-scratch refused",
                "logs refused",
                "pod-logs refused",
            ], saw
            assert "bob-log-line" in node.log("jb/pod")
            runs = supervisor.files.record_path("jb/pod").parent
            assert (runs.stat().st_uid, mode(runs), mode(runs.parent)) == (0, 0o700, 0o700)
            assert supervisor.files.exit_path("jb/pod", 0).stat().st_uid == 0


@needs_root
async def test_a_pod_whose_owner_has_no_account_here_fails_saying_so() -> None:
    with shared_dir() as top:
        async with root_agent(top / "node", run_as="owner") as node:
            node.launch(
                order("j1/p", ["/bin/true"], owner="no-such-account-here"),
                order("j2/p", ["/bin/true"]),
                order("j3/p", ["/bin/true"], owner="root"),
            )
            missing = await node.ended("j1/p")
            assert missing.state == PodState.FAILED
            assert (
                missing.reason
                == "NoSuchUser: no account named 'no-such-account-here' on node root-node"
            )
            assert "NoSuchUser" in node.log("j1/p")
            unowned = await node.ended("j2/p")
            assert unowned.state == PodState.FAILED and unowned.reason.startswith("NoSuchUser:")
            root = await node.ended("j3/p")
            assert root.state == PodState.FAILED and root.reason.startswith("RootRefused:")
