"""Who reads what of an experiment, through the real API of a TLS server with real user
tokens: another user sees its members' progress, never their sweep values, reported values,
notes or the experiment's unredacted spec, and may not stop or delete it."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.server.access import REDACTED
from arranger.server.experiment_calls import HIDDEN
from arranger.v1 import arranger_pb2
from tests.conftest import job_spec
from tests.server.test_auth import issue, secured


async def test_another_user_sees_progress_and_no_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with secured(tmp_path) as cluster:
        alice_token = await issue(cluster, "alice", capsys)
        bob_token = await issue(cluster, "bob", capsys)
        ca = cluster.tls / "ca.pem"
        async with (
            AsyncClient(cluster.address, ca=ca, token=alice_token) as alice,
            AsyncClient(cluster.address, ca=ca, token=bob_token) as bob,
        ):
            doc = job_spec("secret", ["python", "train.py", "--key={token}"])
            doc["spec"] |= {"workerSets": [], "minWorkersNum": 0}
            doc["spec"]["sweep"] = {"parameters": {"token": ["hunter2", "swordfish"]}}
            await alice.submit(doc, queue_anyway=True)
            await alice.report_values("secret-0", [(1, {"loss": 0.5})], {"checkpoint": "/x"})
            mine = await alice.get_experiment("secret")
            assert {m.values["token"] for m in mine.members} == {"hunter2", "swordfish"}
            assert mine.members[0].latest["loss"] == 0.5
            theirs = await bob.get_experiment("secret")
            assert theirs.summary.members == 2 and theirs.summary.stages["Pending"] == 2
            for member in theirs.members:
                assert dict(member.values) == {"token": HIDDEN, "seed": HIDDEN}
                assert not member.latest and not member.notes and member.step == 0
            values = theirs.spec.sweep.parameters["token"].values
            assert [v.string_value for v in values] == [REDACTED, REDACTED]
            job = await bob.get("secret-1")
            assert [v.string_value for v in job.spec.sweep.parameters["token"].values] == [REDACTED]
            assert "swordfish" not in str(job) and "hunter2" not in str(theirs)
            with pytest.raises(ArrangerError) as refused:
                await bob.get_reports("secret")
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
            for call in (bob.stop_experiment, bob.delete_experiment):
                with pytest.raises(ArrangerError) as refused:
                    await call("secret")
                assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
                assert "belongs to 'alice'" in refused.value.message
            with pytest.raises(ArrangerError) as refused:
                await bob.report_values("secret-0", [(2, {"loss": 9.0})])
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
            listed = await bob._stubs[0].ListJobs(arranger_pb2.ListJobsRequest(fold=True))
            assert [e.name for e in listed.experiments] == ["secret"]
