"""experiment_calls: the client API's calls on experiments (read, stop, delete) and on the
values jobs report (see experiments, reports).

Who may do what: an experiment's owner (or an admin) stops and deletes it, and reads its
members' sweep values, reported values and notes; any other user sees what a listing shows
of it (its members' progress; the spec redacted, values hidden). A job token of a member reads
its own experiment whole (population-based training reads its peers' values and published
checkpoints), and reports for its own job; it reaches no other experiment.
"""

from __future__ import annotations

import asyncio

import grpc
import structlog

from arranger.identity import caller
from arranger.server.access import redact
from arranger.server.calls import Calls, Context
from arranger.server.convert import job_summary, spec_to_proto
from arranger.server.effects import Effects
from arranger.server.experiments import members
from arranger.server.history import outcome_of
from arranger.server.model import ExperimentRecord, JobRecord
from arranger.server.reports import (
    MAX_POINTS,
    REPLY_POINTS,
    change_of,
    problem,
    series_to_proto,
)
from arranger.server.store import StoreError
from arranger.v1 import arranger_pb2, job_pb2

log = structlog.get_logger("arranger.server")
HIDDEN = "(hidden)"


def experiment_summary(exp: ExperimentRecord, jobs: list[JobRecord]) -> job_pb2.ExperimentSummary:
    """experiment_summary: the experiment as listings show it (the same to every caller)."""
    sweep = exp.spec.sweep
    assert sweep is not None
    msg = job_pb2.ExperimentSummary(
        name=exp.name,
        id=exp.id,
        owner=exp.owner,
        queue=exp.spec.queue,
        members=len(exp.members),
        max_parallel=sweep.max_parallel,
        seeds=sweep.seeds,
        parameters=[name for name, _ in sweep.parameters],
        deleted=all(job.deleted for job in jobs),
    )
    msg.submit_time.FromNanoseconds(int(exp.submit_time * 1e9))
    for job in jobs:
        if job.deleted:
            continue
        msg.stages[job.stage.value] = msg.stages[job.stage.value] + 1
        if job.stage.finished:
            outcome = outcome_of(job.stage.value, job.reason)  # as its summary says
            msg.outcomes[outcome] = msg.outcomes[outcome] + 1
    return msg


class ExperimentCalls(Calls):
    """ExperimentCalls: the calls on experiments and reports (see the module)."""

    async def _experiment(self, name: str, context: Context) -> ExperimentRecord:
        """_experiment: the experiment a name or an id means (NOT_FOUND if none); a job token
        reaches its own job's experiment only."""
        confined = caller().job
        if confined:
            own = self.view.job(confined)
            exp = self.view.experiment_by_id(own.experiment) if own is not None else None
            if exp is None or name not in (exp.id, exp.name):
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"name: a job token reaches its own job's experiment only (job id {confined})",
                )
                raise AssertionError
            return exp
        found = self.view.experiment(name) if name else None
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"experiment {name!r} not found")
            raise AssertionError
        return found

    def _reads_values(self, exp: ExperimentRecord) -> bool:
        """_reads_values: whether the caller may read the experiment's values and reports."""
        who = caller()
        return bool(who.job) or who.owns(exp.owner)

    async def GetExperiment(
        self, request: arranger_pb2.GetExperimentRequest, context: Context
    ) -> job_pb2.Experiment:
        exp = await self._experiment(request.name, context)
        jobs = self.view.members(exp)
        private = self._reads_values(exp)
        spec = spec_to_proto(exp.spec)
        reply = job_pb2.Experiment(
            summary=experiment_summary(exp, jobs), spec=spec.spec if private else redact(spec).spec
        )
        sweep = exp.spec.sweep
        assert sweep is not None
        for job in jobs:
            if job.deleted:
                continue
            index = job.spec.sweep.member if job.spec.sweep is not None else None
            member = reply.members.add(index=index or 0, job=job_summary(job))
            if job.leader.exit_code is not None:
                member.exit_code = job.leader.exit_code
            if not private:
                member.values.update({k: HIDDEN for k in sweep.values_of(0)})
                continue
            member.values.update(job.spec.sweep.own_values() if job.spec.sweep else {})
            member.values.pop("index", None)
            reports = self.reports.of(job.id)
            if reports is not None:
                member.step = reports.step
                member.latest.update(reports.latest())
                member.notes.update(reports.notes)
        return reply

    async def StopExperiment(
        self, request: arranger_pb2.StopExperimentRequest, context: Context
    ) -> job_pb2.ExperimentSummary:
        exp = await self._experiment(request.name, context)
        await self._may_change_experiment(exp, "stop", context)
        now, who, fx = self.clock(), caller().user, Effects()
        for job in list(members(self.controller, exp)):
            if not job.deleted:
                fx.merge(self.controller.stop(job, now, who))
        await self._commit(context, fx)
        return experiment_summary(exp, self.view.members(exp))

    async def DeleteExperiment(
        self, request: arranger_pb2.DeleteExperimentRequest, context: Context
    ) -> arranger_pb2.DeleteExperimentResponse:
        exp = await self._experiment(request.name, context)
        await self._may_change_experiment(exp, "delete", context)
        now, fx = self.clock(), Effects()
        for job in list(members(self.controller, exp)):
            if not job.deleted:
                fx.merge(self.controller.delete(job, now))
        await self._commit(context, fx)
        return arranger_pb2.DeleteExperimentResponse()

    async def _may_change_experiment(
        self, exp: ExperimentRecord, what: str, context: Context
    ) -> None:
        who = caller()
        if who.job or not who.owns(exp.owner):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what} experiment {exp.name!r}: it belongs to {exp.owner or 'nobody'!r}; only "
                "its owner or an admin may",
            )

    async def ReportValues(
        self, request: arranger_pb2.ReportValuesRequest, context: Context
    ) -> arranger_pb2.ReportValuesResponse:
        job = await self._job(request.job, context)
        await self._may_change(job, "report values of", context)
        if not job.active:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {job.name!r} has ended; it reports nothing more",
            )
        wrong = problem(request)
        if request.pod and request.pod not in job.pods:
            wrong = f"pod: {request.pod[:100]!r} is no pod of job {job.name!r}"
        if wrong:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, wrong)
        if request.pod:  # its progress (see stalls), whether its values are kept or not: a
            # write only when that clears a stall
            fx = self.controller.progress(job, request.pod, self.clock())
            if fx:
                await self._commit(context, fx)
        if request.points or request.notes:
            # Kept to its end even if the caller goes: a write that lands is in memory and
            # charged.
            kept = asyncio.ensure_future(self._keep_report(job, request))
            refused = await asyncio.shield(kept)
            if refused is not None:
                await context.abort(refused[0], refused[1])
        return arranger_pb2.ReportValuesResponse()

    async def _keep_report(
        self, job: JobRecord, request: arranger_pb2.ReportValuesRequest
    ) -> tuple[grpc.StatusCode, str] | None:
        """_keep_report stores a job's report, then keeps it in memory, charged to its owner;
        or says why not. The reports of a job are taken one at a time; the charge is taken
        before the write (reports of the owner's other jobs racing it see it) and given back
        if the write fails."""
        book, gate = self.reports, self.admission.submits
        async with book.lock(job.id):
            # Looked at again: it may have ended (or gone) while this report waited its turn.
            # From here to its write being queued nothing awaits, so a later end is written
            # after it, and its row is there when the report's is.
            if self.view.job(job.id) is not job or not job.active:
                return (
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"job {job.name!r} has ended; it reports nothing more",
                )
            before = book.of(job.id)
            new = book.updated(job.id, request)
            if isinstance(new, str):
                return grpc.StatusCode.RESOURCE_EXHAUSTED, new
            grown = new.size() - (before.size() if before is not None else 0)
            over = gate.bytes_problem(job.owner, grown)
            if over:
                return grpc.StatusCode.RESOURCE_EXHAUSTED, over
            gate.grow(job.id, grown)
            try:
                await self.commit(Effects(reports={job.id: change_of(before, new, request.notes)}))
            except StoreError as exc:
                gate.grow(job.id, -grown)
                return grpc.StatusCode.UNAVAILABLE, f"not stored: {exc}"
            if self.view.job(job.id) is not None:  # still kept (not pruned meanwhile)
                book.put(job.id, new)
        return None

    async def _confined_reports(self, name: str, context: Context) -> list[JobRecord]:
        """_confined_reports: the jobs whose reports a job token asks for: its own job, a
        member of its own experiment (by name or id), or that experiment's members."""
        own = self.view.job(caller().job)
        exp = self.view.experiment_by_id(own.experiment) if own is not None else None
        peers = self.view.members(exp) if exp is not None else ([own] if own else [])
        named = [job for job in peers if name in (job.id, job.name) and not job.deleted]
        if named:
            return named
        return self.view.members(await self._experiment(name, context))

    async def GetReports(
        self, request: arranger_pb2.GetReportsRequest, context: Context
    ) -> arranger_pb2.GetReportsResponse:
        if caller().job:
            jobs = await self._confined_reports(request.name, context)
        else:
            found = self.view.named(request.name)
            if found is None:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"job or experiment {request.name!r} not found"
                )
                raise AssertionError
            jobs = [found] if isinstance(found, JobRecord) else self.view.members(found)
            owner = jobs[0].owner if jobs else ""
            if not caller().owns(owner):
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"reports of {request.name!r}: they belong to {owner or 'nobody'!r}; only "
                    "its owner or an admin may read them",
                )
        kept = [(job, r) for job in jobs if not job.deleted and (r := self.reports.of(job.id))]
        wanted = set(request.keys)
        count = sum(1 for _, r in kept for key in r.series if not wanted or key in wanted)
        keep = max(2, REPLY_POINTS // count) if count else MAX_POINTS  # a reply stays bounded
        reply = arranger_pb2.GetReportsResponse()
        for job, reports in kept:
            out = reply.jobs.add(
                job=job.name, id=job.id, series=series_to_proto(reports, request.keys, keep)
            )
            out.notes.update(reports.notes)
        return reply
