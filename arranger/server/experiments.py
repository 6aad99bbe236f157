"""experiments: sweeps submitted as one (see arranger.sweep), and their members' turns.

An experiment is a record of its own (ExperimentRecord: the spec once, with its sweep) whose
members are ordinary jobs, `NAME-0` .. `NAME-(n-1)`, each scheduled, preempted, retried and
accounted as any job. What holds:

- Turns. With `maxParallel` M, at most M members are *in flight* (active and not held) at
  once: the others are held out of scheduling (`JobRecord.waiting`, reason WaitingForTurn)
  and take no turn from other jobs; as members end, the held ones go in index order. A member
  held for its experiment's dependencies (they are every member's) is turned, once they are
  met, into one held for its turn (see dependencies), so that M holds then too. The hold is
  derived, never stored: a member stored Pending with reason WaitingForTurn is held again when
  read back, and turns are taken again after a load.
- Names. An experiment's name is taken while any member is not deleted (one namespace with
  unfinished jobs', checked at admission); it is deleted once every member is.
- An experiment's row is written once, with its members, and goes with the last member's row
  (reaped or pruned); in memory it goes once that is stored (`dropped`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from arranger.server.effects import Effects
from arranger.server.model import ExperimentRecord, JobRecord
from arranger.spec import JobSpec

TURN = "WaitingForTurn"
TURN_CAME = "TurnCame"


class Keeper(Protocol):
    """Keeper: what holds the jobs and experiments (the controller)."""

    jobs: dict[str, JobRecord]
    waiting: set[str]
    experiments: dict[str, ExperimentRecord]
    experiment_names: dict[str, list[str]]


class Submits(Keeper, Protocol):
    """Submits: a Keeper that submits jobs (the controller)."""

    def submit(
        self,
        job_id: str,
        spec: JobSpec,
        spec_json: str,
        now: float,
        owner: str = "",
        experiment: str = "",
    ) -> tuple[JobRecord, Effects]: ...


def submit(
    keeper: Submits, exp: ExperimentRecord, specs: Sequence[tuple[str, JobSpec, str]], now: float
) -> Effects:
    """submit adds an experiment and its members, (id, spec, spec's JSON) each, by index;
    those past its maxParallel are held (`start`)."""
    fx = Effects(experiments=[exp])
    keeper.experiments[exp.id] = exp
    for job_id, spec, spec_json in specs:
        job, member_fx = keeper.submit(job_id, spec, spec_json, now, exp.owner, exp.id)
        exp.members.append(job.id)
        fx.merge(member_fx)
    remember(keeper, exp)
    start(keeper, exp, now)
    return fx


def members(keeper: Keeper, exp: ExperimentRecord) -> Iterator[JobRecord]:
    """members yields the experiment's members still in memory, by index."""
    for job_id in exp.members:
        job = keeper.jobs.get(job_id)
        if job is not None:
            yield job


def limit_of(exp: ExperimentRecord) -> int:
    """limit_of: the experiment's maxParallel (0: none)."""
    return exp.spec.sweep.max_parallel if exp.spec.sweep is not None else 0


def in_flight(keeper: Keeper, exp: ExperimentRecord) -> int:
    """in_flight: how many members are active and not held."""
    return sum(1 for job in members(keeper, exp) if job.active and not job.waiting)


def hold_turn(waiting: set[str], job: JobRecord, why: str) -> None:
    """hold_turn holds a member until its experiment lets it start (`waiting`: the held
    jobs)."""
    job.waiting = True
    waiting.add(job.id)
    job.reason, job.message = TURN, why


def start(keeper: Keeper, exp: ExperimentRecord, now: float) -> None:
    """start holds the members of an experiment just submitted past its maxParallel (those
    held for dependencies wait for those first)."""
    limit, running = limit_of(exp), 0
    for job in members(keeper, exp):
        if job.waiting or not job.active:
            continue
        if limit and running >= limit:
            hold_turn(keeper.waiting, job, _why(exp, limit))
        else:
            running += 1


def take_turns(keeper: Keeper, exp: ExperimentRecord, now: float, fx: Effects) -> None:
    """take_turns lets members held for their turn go, by index, while fewer than
    maxParallel are in flight."""
    limit = limit_of(exp)
    running = in_flight(keeper, exp) if limit else 0
    for job in members(keeper, exp):
        if limit and running >= limit:
            return
        if not (job.waiting and job.reason == TURN and job.active):
            continue
        job.waiting = False
        keeper.waiting.discard(job.id)
        job.reason, job.message = "Submitted", "waiting for the scheduler"
        job.waiting_since = now
        fx.jobs.add(job.id)
        fx.event(now, TURN_CAME, f"its turn in experiment {exp.name}", job)
        fx.schedule = True
        running += 1


def settle(keeper: Keeper, fx: Effects, now: float) -> None:
    """settle takes turns in the experiments of the members `fx` touched (one ended, or was
    turned from waiting for its dependencies to waiting for its turn)."""
    touched = {
        job.experiment
        for j in fx.jobs
        if (job := keeper.jobs.get(j) or fx.removed.get(j)) and job.experiment
    }  # a member reaped with this change is in `removed` only
    for exp_id in sorted(touched):
        exp = keeper.experiments.get(exp_id)
        if exp is not None:
            take_turns(keeper, exp, now, fx)


def hold_as_stored(keeper: Keeper, job: JobRecord) -> None:
    """hold_as_stored holds again a member read back from the store that was held for its
    turn (its experiment takes turns again once every job is known: `take_turns`)."""
    if job.reason == TURN and job.active and job.stage.value == "Pending" and job.experiment:
        hold_turn(keeper.waiting, job, job.message)


def restore(keeper: Keeper, jobs: Iterable[JobRecord], stored: Iterable[ExperimentRecord]) -> None:
    """restore makes the stored experiments known with their members (the jobs loaded, in
    submit order: by index), before the jobs are put back (which names them). One with no
    member left lost its last member's row in a write whose end this server did not see."""
    known = {exp.id: exp for exp in stored}
    for job in jobs:
        if job.experiment in known:
            known[job.experiment].members.append(job.id)
    keeper.experiments.update((i, exp) for i, exp in known.items() if exp.members)


def remember(keeper: Keeper, exp: ExperimentRecord) -> None:
    """remember makes an experiment known by id and, unless every member is deleted, by
    name (oldest first)."""
    keeper.experiments[exp.id] = exp
    if any(not job.deleted for job in members(keeper, exp)):
        named(keeper, exp)


def named(keeper: Keeper, exp: ExperimentRecord) -> None:
    """named: the experiment's name reaches it (a member of it is not deleted)."""
    ids = keeper.experiment_names.setdefault(exp.name, [])
    if exp.id not in ids:
        ids.append(exp.id)
        ids.sort(key=lambda i: (keeper.experiments[i].submit_time, i))


def member_deleted(keeper: Keeper, job: JobRecord) -> None:
    """member_deleted: a job was deleted; if it was its experiment's last member not
    deleted, the experiment is deleted (`deleted`)."""
    exp = keeper.experiments.get(job.experiment) if job.experiment else None
    if exp is not None and all(j.deleted for j in members(keeper, exp)):
        deleted(keeper, exp)


def deleted(keeper: Keeper, exp: ExperimentRecord) -> None:
    """deleted: every member of the experiment is deleted: its name is free."""
    ids = keeper.experiment_names.get(exp.name)
    if ids is not None and exp.id in ids:
        ids.remove(exp.id)
        if not ids:
            del keeper.experiment_names[exp.name]


def forget(keeper: Keeper, job: JobRecord) -> None:
    """forget: a member has left memory (reaped, pruned, withdrawn); with the last, the
    experiment's name is free (its record goes once that is stored: `dropped`)."""
    exp = keeper.experiments.get(job.experiment)
    if exp is not None and not any(j in keeper.jobs for j in exp.members if j != job.id):
        deleted(keeper, exp)


def dropped(keeper: Keeper, removed: Iterable[JobRecord]) -> None:
    """dropped: the rows of these jobs are gone from the store; an experiment none of whose
    members is left in memory goes too (its row went with the last: the store's)."""
    for exp_id in {job.experiment for job in removed if job.experiment}:
        exp = keeper.experiments.get(exp_id)
        if exp is not None and not any(j in keeper.jobs for j in exp.members):
            del keeper.experiments[exp_id]


def _why(exp: ExperimentRecord, limit: int) -> str:
    return f"waiting for its turn: experiment {exp.name} runs at most {limit} members at once"
