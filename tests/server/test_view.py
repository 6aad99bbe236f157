"""ClusterView: the read side of a real Controller, driven only by its stimuli."""

from __future__ import annotations

from arranger.client.specfile import load_job_yaml
from arranger.sched import JobDecision, Placement, Plan
from arranger.server.controller import Controller
from arranger.server.convert import spec_to_json
from arranger.server.listing import key_of
from arranger.server.model import JobRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.queues import QueueRecord
from arranger.server.validation import parse_job
from arranger.states import PodState, ScheduleState, Stage

SPEC = """
metadata: {{name: {name}, queue: {queue}}}
spec:
  leader: {{name: learner, template: {{command: [l]}}}}
  workerSets: [{{name: actors, counts: 1, template: {{command: [a]}}}}]
"""


class World:
    """World: a controller with nodes b and a (registered in that order) and a clock."""

    def __init__(self) -> None:
        self.c = Controller()
        self.view = self.c.view
        self.now = 100.0
        for name in ("b", "a"):
            self.c.node_registered(NodeRegistration(name, f"10.0.0.{name}", 8000, 2**33), self.now)

    def submit(self, job_id: str, name: str, queue: str = "default", owner: str = "") -> JobRecord:
        self.now += 1.0
        spec = parse_job(load_job_yaml(SPEC.format(name=name, queue=queue)))
        job, _ = self.c.submit(job_id, spec, spec_to_json(spec), self.now, owner)
        return job

    def place(self, job: JobRecord, node: str) -> None:
        placements = [Placement(job.id, pod, node) for pod in job.pods]
        decision = JobDecision(job.id, ScheduleState.SCHEDULED_SUCCEED)
        self.c.apply_plan(Plan(placements, {job.id: decision}), self.now)

    def ended(self, job: JobRecord, pod_name: str, state: PodState) -> None:
        pod = job.pods[pod_name]
        self.c.pod_reports(pod.node, [PodReport(pod.uid, pod.attempt, state)], self.now)


def test_find_means_the_newest_job_of_a_name_and_an_id_reaches_any() -> None:
    w = World()
    first = w.submit("j1", "rl")
    assert w.view.find("rl") is first and w.view.unfinished("rl") is first
    w.c.stop(first, w.now)
    assert first.stage.finished and w.view.unfinished("rl") is None
    second = w.submit("j2", "rl")
    assert w.view.find("rl") is second and w.view.find("j1") is first
    assert w.view.unfinished("rl") is second
    w.c.delete(second, w.now)
    # Deleted: no longer found by name or id; nothing of it ran, so it is reaped at once.
    assert w.view.find("j2") is None and w.view.job("j2") is None
    assert w.view.find("rl") is first
    assert w.view.find("nothing") is None and w.view.job("nothing") is None


def test_listed_is_listing_order_from_a_key_and_of_an_owner() -> None:
    w = World()
    jobs = [w.submit(f"j{i}", f"n{i}", owner="ann" if i % 2 else "bob") for i in range(5)]
    assert [j.id for j in w.view.listed()] == ["j0", "j1", "j2", "j3", "j4"]
    assert [j.id for j in w.view.listed(key_of(jobs[1]))] == ["j2", "j3", "j4"]
    assert [j.id for j in w.view.listed(owner="ann")] == ["j1", "j3"]
    assert [j.id for j in w.view.listed(key_of(jobs[1]), "bob")] == ["j2", "j4"]
    # A deleted job whose pods still run stays in memory (job) but is never listed.
    w.place(jobs[2], "a")
    w.ended(jobs[2], "n2-learner", PodState.RUNNING)
    w.c.delete(jobs[2], w.now)
    assert w.view.job("j2") is jobs[2] and w.view.find("j2") is None
    assert [j.id for j in w.view.listed()] == ["j0", "j1", "j3", "j4"]
    assert {j.id for j in w.view.jobs()} == {"j0", "j1", "j2", "j3", "j4"}


def test_queues_and_their_jobs() -> None:
    w = World()
    w.c.put_queue(QueueRecord("research", weight=2.0), w.now)
    w.c.put_queue(QueueRecord("batch"), w.now)
    assert [q.name for q in w.view.queues()] == ["batch", "default", "research"]
    research = w.view.queue("research")
    assert research is not None and research.weight == 2.0
    assert w.view.queue("missing") is None
    done, running = w.submit("j1", "a", "research"), w.submit("j2", "b", "research")
    w.submit("j3", "c", "batch")
    w.c.stop(done, w.now)
    assert {j.id for j in w.view.jobs_in_queue("research")} == {"j1", "j2"}
    assert w.view.queue_in_use("research") == 1 and w.view.queue_in_use("default") == 0
    w.c.delete(running, w.now)
    assert [j.id for j in w.view.jobs_in_queue("research")] == ["j1"]
    assert w.view.queue_in_use("research") == 0


def test_nodes_and_what_their_pods_hold() -> None:
    w = World()
    assert [n.name for n in w.view.nodes()] == ["a", "b"] and w.view.node_count() == 2
    node = w.view.node("a")
    assert node is not None and node.address == "10.0.0.a" and w.view.node("z") is None
    older, newer = w.submit("j1", "x"), w.submit("j2", "y")
    assert w.view.pods_on("a") == [] and w.view.jobs_on("a") == []
    w.place(newer, "a")
    w.place(older, "a")
    held = [(job.id, pod.name) for job, pod in w.view.pods_on("a")]
    assert held == [
        ("j1", "x-learner"),
        ("j1", "x-actors-0"),
        ("j2", "y-learner"),
        ("j2", "y-actors-0"),
    ]
    assert w.view.pods_on("b") == []
    found = w.view.pod("j1/x-learner")
    assert found is not None and found[0] is older and found[1].node == "a"
    assert w.view.pod("j1/nothing") is None and w.view.pod("nope/x-learner") is None
    # A pod that ended holds nothing; its job was on the node all the same.
    w.ended(newer, "y-learner", PodState.RUNNING)
    w.ended(newer, "y-learner", PodState.SUCCEEDED)
    assert newer.stage == Stage.SUCCEEDED
    assert [(job.id, pod.name) for job, pod in w.view.pods_on("a")] == [
        ("j1", "x-learner"),
        ("j1", "x-actors-0"),
    ]
    assert [job.id for job in w.view.jobs_on("a")] == ["j1", "j2"]


def test_the_view_follows_the_records_as_they_change() -> None:
    w = World()
    job = w.submit("j1", "x")
    w.c.withdraw(job)  # its submit was not stored
    assert w.view.job("j1") is None and w.view.find("x") is None and list(w.view.listed()) == []
    w.c.node_registered(NodeRegistration("c", "10.0.0.c", 8000, 2**33), w.now)
    assert [n.name for n in w.view.nodes()] == ["a", "b", "c"]
    w.c.delete_queue("default", w.now)
    assert [q.name for q in w.view.queues()] == []
