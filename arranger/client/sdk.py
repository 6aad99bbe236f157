"""sdk is the Python client of arranger-server: AsyncClient for asyncio code, Client otherwise.

Both take a job as a TYJob message, a dict in the YAML's shape, or YAML text, and return typed
protobuf messages. Every server refusal becomes an ArrangerError with the gRPC code and the
server's one-line message. Client runs an AsyncClient on an event loop of its own thread, so
the two always behave the same.

    from arranger.client.sdk import Client
    with Client("127.0.0.1:50051") as c:
        job = c.submit(open("job.yaml").read())
        done = c.wait(job.metadata.name)
        print(done.status.stage)
        for job in c.jobs(mine=True):  # summaries: no spec, whatever its size
            print(job.name, job.progress.stage)
        sweep = c.get_experiment("sweep-a")  # a spec with spec.sweep submits an experiment
        for member in sweep.members:
            print(member.index, dict(member.values), member.job.progress.stage, member.latest)

These are the SDK's public names; aio (AsyncClient), blocking (Client), connection (which
server a call goes to), channel (ArrangerError), messages and podexec (ExecResult) define
them.
"""

from arranger.client.aio import FINISHED, AsyncClient, WatchExpired, When
from arranger.client.blocking import Client
from arranger.client.channel import REPLY_LIMIT, ArrangerError
from arranger.client.messages import JobLike, as_job, progress_of, queue_message
from arranger.client.podexec import ExecResult

__all__ = [
    "FINISHED",
    "REPLY_LIMIT",
    "ArrangerError",
    "AsyncClient",
    "Client",
    "ExecResult",
    "JobLike",
    "WatchExpired",
    "When",
    "as_job",
    "progress_of",
    "queue_message",
]
