"""schema is the SQLite schema as an ordered list of migrations.

`PRAGMA user_version` holds how many have been applied. A migration is appended, never edited:
a store written by an older server is brought forward on open; one written by a newer server
is refused rather than misread.
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: jobs, pods, nodes, events.
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        queue TEXT NOT NULL,
        spec TEXT NOT NULL,
        stage TEXT NOT NULL,
        schedule_state TEXT NOT NULL,
        reason TEXT NOT NULL,
        message TEXT NOT NULL,
        submit_time REAL NOT NULL,
        start_time REAL,
        finish_time REAL,
        leader_restarts INTEGER NOT NULL,
        set_restarts TEXT NOT NULL,
        terminating INTEGER NOT NULL,
        deleted INTEGER NOT NULL,
        infeasible_since REAL,
        leader_address TEXT NOT NULL
    );
    CREATE UNIQUE INDEX jobs_live_name ON jobs(name) WHERE deleted = 0;
    CREATE TABLE pods (
        uid TEXT PRIMARY KEY,
        job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        worker_set TEXT NOT NULL,
        idx INTEGER NOT NULL,
        rank INTEGER NOT NULL,
        in_minimum INTEGER NOT NULL,
        state TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        node TEXT NOT NULL,
        gpus TEXT NOT NULL,
        exit_code INTEGER,
        reason TEXT NOT NULL,
        pid INTEGER NOT NULL,
        ports TEXT NOT NULL,
        start_time REAL,
        finish_time REAL,
        not_before REAL NOT NULL,
        stopping INTEGER NOT NULL,
        requeue INTEGER NOT NULL,
        done INTEGER NOT NULL
    );
    CREATE INDEX pods_job ON pods(job_id);
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        cpu_milli INTEGER NOT NULL,
        memory_bytes INTEGER NOT NULL,
        gpus TEXT NOT NULL,
        labels TEXT NOT NULL,
        state TEXT NOT NULL,
        cordoned INTEGER NOT NULL,
        agent_version TEXT NOT NULL,
        runtimes TEXT NOT NULL
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time REAL NOT NULL,
        kind TEXT NOT NULL,
        job_id TEXT NOT NULL,
        job_name TEXT NOT NULL,
        pod TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX events_job ON events(job_id, id);
    """,
]

MIGRATIONS.append(
    # 2: queues; the default queue always exists.
    """
    CREATE TABLE queues (
        name TEXT PRIMARY KEY,
        weight REAL NOT NULL,
        cpu_milli INTEGER,
        memory_bytes INTEGER,
        gpu_milli INTEGER,
        machine_groups TEXT NOT NULL
    );
    INSERT INTO queues VALUES ('default', 1.0, NULL, NULL, NULL, '[]');
    """
)

MIGRATIONS.append(
    # 3: when a job's minimum last started waiting (submit, or an eviction of the whole job).
    """
    ALTER TABLE jobs ADD COLUMN waiting_since REAL;
    UPDATE jobs SET waiting_since = submit_time;
    """
)

MIGRATIONS.append(
    # 4: bearer tokens for the API, by name; only the SHA-256 of each is kept.
    """
    CREATE TABLE tokens (
        name TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        created REAL NOT NULL
    );
    """
)

MIGRATIONS.append(
    # 5: owners, roles and queue policies. Tokens name a user and a role; a token issued before
    # roles existed becomes a `user` token of the user its name says (an admin makes a new admin
    # token on the head node). Jobs submitted before owners existed have none: only admins may
    # change them. Queues say who may submit, up to which priority, and whether jobs may ask
    # not to be preempted.
    """
    ALTER TABLE tokens ADD COLUMN user TEXT NOT NULL DEFAULT '';
    ALTER TABLE tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'user';
    ALTER TABLE tokens ADD COLUMN last_used REAL;
    UPDATE tokens SET user = name;
    ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
    ALTER TABLE queues ADD COLUMN users TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE queues ADD COLUMN max_priority INTEGER;
    ALTER TABLE queues ADD COLUMN allow_non_preemptible INTEGER NOT NULL DEFAULT 0;
    """
)

MIGRATIONS.append(
    # 6: the cluster's id, made once with the store (a store migrated from an older version
    # gets one now). Agents remember the id of the cluster they joined and obey no server whose
    # store has another, so a server started on the wrong store cannot order them about.
    """
    CREATE TABLE cluster (
        id TEXT NOT NULL,
        created REAL NOT NULL
    );
    INSERT INTO cluster VALUES (lower(hex(randomblob(16))), CAST(strftime('%s', 'now') AS REAL));
    """
)

MIGRATIONS.append(
    # 7: a name is unique among unfinished jobs only: the same spec may be submitted again once
    # its job has ended. A name then means the newest job of that name; older runs keep their
    # ids.
    """
    DROP INDEX jobs_live_name;
    CREATE UNIQUE INDEX jobs_unfinished_name ON jobs(name)
        WHERE deleted = 0 AND stage NOT IN ('Succeeded', 'Failed');
    """
)

MIGRATIONS.append(
    # 8: the history of finished jobs, kept after they are deleted or pruned (see
    # arranger.server.history), and what jobs and pods need to write it: usage so far, the
    # nodes a job ran on, who stopped it, when a pod's attempt began to hold its node. Jobs
    # that finished before are given records when the server starts.
    """
    CREATE TABLE history (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        owner TEXT NOT NULL,
        queue TEXT NOT NULL,
        priority INTEGER NOT NULL,
        submit_time REAL NOT NULL,
        start_time REAL,
        end_time REAL NOT NULL,
        waited_s REAL NOT NULL,
        ran_s REAL NOT NULL,
        stage TEXT NOT NULL,
        reason TEXT NOT NULL,
        message TEXT NOT NULL,
        stopped_by TEXT NOT NULL,
        leader_exit INTEGER,
        worker_exits TEXT NOT NULL,
        nodes TEXT NOT NULL,
        pods INTEGER NOT NULL,
        restarts INTEGER NOT NULL,
        cpu_core_hours REAL NOT NULL,
        gpu_hours REAL NOT NULL,
        memory_gib_hours REAL NOT NULL
    );
    CREATE INDEX history_end ON history(end_time, id);
    CREATE INDEX history_owner ON history(owner, end_time, id);
    ALTER TABLE jobs ADD COLUMN stopped_by TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN nodes_used TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE jobs ADD COLUMN cpu_core_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN memory_gib_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN gpu_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE pods ADD COLUMN held_since REAL;
    """
)

MIGRATIONS.append(
    # 9: working directories shipped with jobs (see arranger.server.packages), by the SHA-256
    # of their archive, in chunks of at most a MiB so that none is read or written whole; a
    # package is `complete` once all its chunks are stored, and `touched` when it was last
    # uploaded or asked for. Each job names its package, so that pruning keeps those a job
    # still refers to.
    """
    CREATE TABLE packages (
        sha256 TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        touched REAL NOT NULL,
        complete INTEGER NOT NULL
    );
    CREATE TABLE package_chunks (
        sha256 TEXT NOT NULL REFERENCES packages(sha256) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (sha256, seq)
    );
    ALTER TABLE jobs ADD COLUMN package TEXT NOT NULL DEFAULT '';
    CREATE INDEX jobs_package ON jobs(package) WHERE package <> '';
    """
)

MIGRATIONS.append(
    # 10: what a finished job's pods used, from the agents' samples (see arranger.server.usage);
    # NULL where no sample came (jobs that finished before, or too soon to be sampled).
    """
    ALTER TABLE history ADD COLUMN avg_cpu_cores REAL;
    ALTER TABLE history ADD COLUMN peak_cpu_cores REAL;
    ALTER TABLE history ADD COLUMN peak_memory_bytes INTEGER;
    ALTER TABLE history ADD COLUMN avg_gpu_utilization REAL;
    ALTER TABLE history ADD COLUMN peak_gpu_memory_bytes INTEGER;
    """
)

MIGRATIONS.append(
    # 11: the cluster's key for job tokens (see arranger.server.job_tokens): a pod's token is
    # derived from it and its job's id, so every server of the cluster checks it alike.
    """
    ALTER TABLE cluster ADD COLUMN job_key TEXT NOT NULL DEFAULT '';
    UPDATE cluster SET job_key = lower(hex(randomblob(32)));
    """
)

MIGRATIONS.append(
    # 12: when each job's learner last confirmed a checkpoint (NULL: never, as for every job
    # stored before), and each queue's minRunSeconds (0: off, as for every queue before): what
    # the scheduler weighs when it chooses whom to evict.
    """
    ALTER TABLE jobs ADD COLUMN checkpoint_time REAL;
    ALTER TABLE queues ADD COLUMN min_run_s REAL NOT NULL DEFAULT 0;
    """
)

MIGRATIONS.append(
    # 13: who may read each package: the users who uploaded it (two who upload the same content
    # each own it; see arranger.server.packages). A package a stored job names becomes its
    # owners' (the owners of the jobs naming it); one no job names, or named only by jobs from
    # before owners, is no one's: admins alone may read it, until it is pruned.
    """
    CREATE TABLE package_owners (
        sha256 TEXT NOT NULL REFERENCES packages(sha256) ON DELETE CASCADE,
        owner TEXT NOT NULL,
        PRIMARY KEY (sha256, owner)
    );
    CREATE INDEX package_owners_owner ON package_owners(owner, sha256);
    INSERT INTO package_owners (sha256, owner)
        SELECT DISTINCT package, owner FROM jobs
        WHERE package <> '' AND owner <> '' AND package IN (SELECT sha256 FROM packages);
    """
)

MIGRATIONS.append(
    # 14: how each recorded job ended (see arranger.server.history.outcome_of) and each of its
    # pods' exit code and signal, as a JSON list of [pod, code or null, signal]. Records
    # written before have an outcome derived from their stage and reason (Stopped for reason
    # Stopped, else Completed when Succeeded, else Failed: no record was written then for a
    # deleted job) and no per-pod exits (`[]`: only the counts by code were kept).
    """
    ALTER TABLE history ADD COLUMN outcome TEXT NOT NULL DEFAULT '';
    ALTER TABLE history ADD COLUMN pod_exits TEXT NOT NULL DEFAULT '[]';
    UPDATE history SET outcome = CASE
        WHEN stage = 'Succeeded' AND reason = 'Stopped' THEN 'Stopped'
        WHEN stage = 'Succeeded' THEN 'Completed'
        ELSE 'Failed' END;
    """
)

MIGRATIONS.append(
    # 15: which agent holds each node's name (see arranger.server.node_holders), so that after
    # a restart a twin of the node (a cloned machine) cannot take it before its own agent
    # comes back. Nodes stored before hold none: the first agent to register takes the name.
    """
    ALTER TABLE nodes ADD COLUMN agent_id TEXT NOT NULL DEFAULT '';
    """
)

MIGRATIONS.append(
    # 16: experiments (see arranger.server.experiments): each submitted sweep's spec, once, and
    # which experiment each job and each history record is a member of ('' for none, as for
    # every job before); the values jobs report, a row a point, and the texts they publish (see
    # arranger.server.reports), which go with their job's row.
    """
    CREATE TABLE experiments (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        owner TEXT NOT NULL,
        queue TEXT NOT NULL,
        spec TEXT NOT NULL,
        submit_time REAL NOT NULL,
        members INTEGER NOT NULL
    );
    ALTER TABLE jobs ADD COLUMN experiment TEXT NOT NULL DEFAULT '';
    CREATE INDEX jobs_experiment ON jobs(experiment) WHERE experiment <> '';
    ALTER TABLE history ADD COLUMN experiment TEXT NOT NULL DEFAULT '';
    CREATE INDEX history_experiment ON history(experiment, end_time, id) WHERE experiment <> '';
    CREATE TABLE report_points (
        job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        step INTEGER NOT NULL,
        value REAL NOT NULL,
        PRIMARY KEY (job_id, key, step)
    );
    CREATE TABLE report_notes (
        job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        text TEXT NOT NULL,
        PRIMARY KEY (job_id, key)
    );
    """
)

MIGRATIONS.append(
    # 17: each job's restarts for an exit code in retryOnExitCodes (see
    # arranger.server.lifecycle), by worker set, "" for the leader; none before. Each queue's
    # idleGpuStopMinutes, in seconds (see arranger.server.idle_gpus; 0: never, as before).
    """
    ALTER TABLE jobs ADD COLUMN retries TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE queues ADD COLUMN idle_gpu_stop_s REAL NOT NULL DEFAULT 0;
    """
)
