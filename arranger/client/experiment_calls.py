"""experiment_calls: the calls of AsyncClient for experiments (a sweep's jobs, see Sweep) and
their reported values, and the paging of ListJobs that a listing of jobs with or without its
experiments shares.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping

from arranger.client.connection import Connection
from arranger.v1 import arranger_pb2, job_pb2


class ExperimentCalls(Connection):
    """ExperimentCalls: the experiment calls of AsyncClient (an experiment is named by its name
    or its id; its members are jobs named `<name>-<index>`)."""

    async def get_experiment(self, name: str) -> job_pb2.Experiment:
        """get_experiment: the experiment (its summary, the spec it was submitted with, and
        each member's sweep values, `seed` among them, progress, exit code and latest reported
        values); NOT_FOUND when there is none."""
        request = arranger_pb2.GetExperimentRequest(name=name)
        return await self._call(lambda stub: stub.GetExperiment(request, timeout=self.timeout_s))

    async def stop_experiment(self, name: str) -> job_pb2.ExperimentSummary:
        """stop_experiment stops every unfinished member (those held never start); returns the
        experiment's summary as it is then."""
        request = arranger_pb2.StopExperimentRequest(name=name)
        return await self._call(lambda stub: stub.StopExperiment(request, timeout=self.timeout_s))

    async def delete_experiment(self, name: str) -> None:
        """delete_experiment deletes every member and the experiment (their history stays)."""
        request = arranger_pb2.DeleteExperimentRequest(name=name)
        await self._call(lambda stub: stub.DeleteExperiment(request, timeout=self.timeout_s))

    async def get_reports(
        self, name: str, keys: Iterable[str] = ()
    ) -> list[arranger_pb2.JobReports]:
        """get_reports: the reported series of a job, or of each member of an experiment (by
        name or id), one JobReports per job: for each key of `keys` (none: every key) its
        steps ascending and their values (older points down-sampled), and its notes."""
        request = arranger_pb2.GetReportsRequest(name=name, keys=list(keys))
        reply: arranger_pb2.GetReportsResponse = await self._call(
            lambda stub: stub.GetReports(request, timeout=self.timeout_s)
        )
        return list(reply.jobs)

    async def report_values(
        self,
        job: str,
        points: Iterable[tuple[int, Mapping[str, float]]],
        notes: Mapping[str, str] | None = None,
    ) -> None:
        """report_values keeps values a job reports: each point is (step, {key: value}); `notes`
        are texts kept as latest only (a job's own programs use arranger.job instead)."""
        request = arranger_pb2.ReportValuesRequest(
            job=job,
            points=[arranger_pb2.ReportPoint(step=step, values=dict(v)) for step, v in points],
            notes=dict(notes or {}),
        )
        await self._call(lambda stub: stub.ReportValues(request, timeout=self.timeout_s))

    async def jobs_and_experiments(
        self, queue: str = "", stages: Iterable[str] = (), owner: str = "", mine: bool = False
    ) -> tuple[list[job_pb2.JobSummary], list[job_pb2.ExperimentSummary]]:
        """jobs_and_experiments: the jobs `jobs` lists less the experiments' members, oldest
        first, and the experiments of that queue and owner, oldest first (whatever their
        members' stages: the stage filter is the jobs')."""
        jobs: list[job_pb2.JobSummary] = []
        experiments: list[job_pb2.ExperimentSummary] = []
        async for page in self._pages(queue, stages, owner, mine, 0, fold=True):
            jobs.extend(page.jobs)
            experiments.extend(page.experiments)
        return jobs, experiments

    async def _pages(
        self,
        queue: str,
        stages: Iterable[str],
        owner: str,
        mine: bool,
        page_size: int,
        *,
        fold: bool = False,
        experiment: str = "",
    ) -> AsyncGenerator[arranger_pb2.ListJobsResponse, None]:
        """_pages yields ListJobs' pages for the filters, the first first."""
        request = arranger_pb2.ListJobsRequest(
            queue=queue,
            stages=list(stages),
            owner=owner,
            mine=mine,
            page_size=page_size,
            fold=fold,
            experiment=experiment,
        )
        while True:
            reply: arranger_pb2.ListJobsResponse = await self._call(
                lambda stub: stub.ListJobs(request, timeout=self.timeout_s)
            )
            yield reply
            request.page_token = token = reply.next_page_token
            if not token:
                return
