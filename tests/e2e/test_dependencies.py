"""spec.dependsOn end to end (Slurm's --dependency): a job waits, saying on what, until the
jobs it names have ended as it wants; one whose dependency can never be met fails without
starting; names that mean no job are refused at submit, naming the field. A real server and
agents, real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from arranger.client.sdk import ArrangerError, AsyncClient
from tests.conftest import Gate, job_spec


def after(name: str, *needs: tuple[str, str]) -> dict[str, object]:
    spec = job_spec(name, leader=["true"], worker=["true"])
    spec["spec"]["dependsOn"] = [{"job": job, "when": when} for job, when in needs]  # type: ignore[index]
    return spec


async def test_jobs_wait_for_theirs_and_fail_when_theirs_can_never_be_met(
    client: AsyncClient, tmp_path: Path, gate: Gate
) -> None:
    first = await client.submit(
        job_spec("first", leader=gate.command(tmp_path), worker=gate.command(tmp_path, "w"))
    )
    first_id = first.metadata.id
    await client.submit(after("ok", ("first", "succeeded")))
    await client.submit(after("any", (first_id, "finished")))
    await client.submit(after("notok", ("first", "failed")))
    await client.submit(after("chained", ("notok", "succeeded")))
    await client.wait("first", stages=["Running"], timeout_s=30)

    held = await client.get("ok")
    assert held.status.stage == "Pending" and held.status.reason == "WaitingForDependencies"
    assert held.status.message == f"waiting for job first ({first_id}) to succeed"
    assert held.spec.depends_on[0].job == first_id  # stored by id
    assert all(not p.node for p in [held.status.leader, *held.status.workers])
    explained = await client.explain("ok")
    assert explained.message == held.status.message

    gate.open()
    for name in ("ok", "any"):
        done = await client.wait(name, timeout_s=60)
        assert done.status.stage == "Succeeded", done.status
    for name in ("notok", "chained"):
        done = await client.wait(name, timeout_s=60)
        assert (done.status.stage, done.status.reason) == ("Failed", "DependencyNeverMet")
        assert not done.status.leader.start_time.seconds, "it never started"
    notok = await client.get("notok")
    assert notok.status.message == (
        f"spec.dependsOn[0]: job first ({first_id}) ended Completed, and it waited for it to fail"
    )
    kinds = [e.kind for e in await client.events("ok")]
    assert "DependenciesMet" in kinds


@pytest.mark.parametrize(
    ("needs", "said"),
    [
        (
            [("no-such-job", "succeeded")],
            "spec.dependsOn[0].job: no job or experiment 'no-such-job' is kept",
        ),
        ([("first", "sometimes")], "spec.dependsOn[0].when: 'sometimes' is not one of"),
        ([("", "finished")], "spec.dependsOn[0].job: give a job's name or id"),
    ],
)
async def test_a_dependency_that_names_no_job_is_refused_naming_the_field(
    client: AsyncClient, needs: list[tuple[str, str]], said: str
) -> None:
    await client.submit(job_spec("first", leader=["true"], worker=["true"]))
    with pytest.raises(ArrangerError) as refused:
        await client.submit(after("later", *needs))
    assert said in refused.value.message
