"""postgres_schema is the PostgreSQL schema as an ordered list of migrations.

The table `schema_version` holds how many have been applied. A migration is appended, never
edited. The first is today's whole schema: the same tables, columns and indexes as the SQLite
store after all of its migrations (see sqlite_schema), so that the rows of `rows` fit both.
Booleans are 0/1 integers and nested values JSON text, as in SQLite; `user` is quoted (a
reserved word here).
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: everything the SQLite store has at its version 8.
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
        submit_time DOUBLE PRECISION NOT NULL,
        start_time DOUBLE PRECISION,
        finish_time DOUBLE PRECISION,
        leader_restarts BIGINT NOT NULL,
        set_restarts TEXT NOT NULL,
        terminating INTEGER NOT NULL,
        deleted INTEGER NOT NULL,
        infeasible_since DOUBLE PRECISION,
        leader_address TEXT NOT NULL,
        waiting_since DOUBLE PRECISION,
        owner TEXT NOT NULL DEFAULT '',
        stopped_by TEXT NOT NULL DEFAULT '',
        nodes_used TEXT NOT NULL DEFAULT '[]',
        cpu_core_s DOUBLE PRECISION NOT NULL DEFAULT 0,
        memory_gib_s DOUBLE PRECISION NOT NULL DEFAULT 0,
        gpu_s DOUBLE PRECISION NOT NULL DEFAULT 0
    );
    CREATE UNIQUE INDEX jobs_unfinished_name ON jobs(name)
        WHERE deleted = 0 AND stage NOT IN ('Succeeded', 'Failed');
    CREATE TABLE pods (
        uid TEXT PRIMARY KEY,
        job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        worker_set TEXT NOT NULL,
        idx BIGINT NOT NULL,
        rank BIGINT NOT NULL,
        in_minimum INTEGER NOT NULL,
        state TEXT NOT NULL,
        attempt BIGINT NOT NULL,
        node TEXT NOT NULL,
        gpus TEXT NOT NULL,
        exit_code BIGINT,
        reason TEXT NOT NULL,
        pid BIGINT NOT NULL,
        ports TEXT NOT NULL,
        start_time DOUBLE PRECISION,
        finish_time DOUBLE PRECISION,
        not_before DOUBLE PRECISION NOT NULL,
        stopping INTEGER NOT NULL,
        requeue BIGINT NOT NULL,
        done INTEGER NOT NULL,
        held_since DOUBLE PRECISION
    );
    CREATE INDEX pods_job ON pods(job_id);
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        cpu_milli BIGINT NOT NULL,
        memory_bytes BIGINT NOT NULL,
        gpus TEXT NOT NULL,
        labels TEXT NOT NULL,
        state TEXT NOT NULL,
        cordoned INTEGER NOT NULL,
        agent_version TEXT NOT NULL,
        runtimes TEXT NOT NULL
    );
    CREATE TABLE events (
        id BIGSERIAL PRIMARY KEY,
        time DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        job_id TEXT NOT NULL,
        job_name TEXT NOT NULL,
        pod TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX events_job ON events(job_id, id);
    CREATE TABLE queues (
        name TEXT PRIMARY KEY,
        weight DOUBLE PRECISION NOT NULL,
        cpu_milli BIGINT,
        memory_bytes BIGINT,
        gpu_milli BIGINT,
        machine_groups TEXT NOT NULL,
        users TEXT NOT NULL DEFAULT '[]',
        max_priority BIGINT,
        allow_non_preemptible INTEGER NOT NULL DEFAULT 0
    );
    INSERT INTO queues (name, weight, machine_groups) VALUES ('default', 1.0, '[]');
    CREATE TABLE tokens (
        name TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        created DOUBLE PRECISION NOT NULL,
        "user" TEXT NOT NULL,
        role TEXT NOT NULL,
        last_used DOUBLE PRECISION
    );
    CREATE TABLE cluster (
        id TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL
    );
    INSERT INTO cluster VALUES
        (replace(gen_random_uuid()::text, '-', ''), extract(epoch FROM now()));
    CREATE TABLE history (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        owner TEXT NOT NULL,
        queue TEXT NOT NULL,
        priority BIGINT NOT NULL,
        submit_time DOUBLE PRECISION NOT NULL,
        start_time DOUBLE PRECISION,
        end_time DOUBLE PRECISION NOT NULL,
        waited_s DOUBLE PRECISION NOT NULL,
        ran_s DOUBLE PRECISION NOT NULL,
        stage TEXT NOT NULL,
        reason TEXT NOT NULL,
        message TEXT NOT NULL,
        stopped_by TEXT NOT NULL,
        leader_exit BIGINT,
        worker_exits TEXT NOT NULL,
        nodes TEXT NOT NULL,
        pods BIGINT NOT NULL,
        restarts BIGINT NOT NULL,
        cpu_core_hours DOUBLE PRECISION NOT NULL,
        gpu_hours DOUBLE PRECISION NOT NULL,
        memory_gib_hours DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX history_end ON history(end_time, id);
    CREATE INDEX history_owner ON history(owner, end_time, id);
    """,
]

MIGRATIONS.append(
    # 2: the lease that makes one of the servers sharing this database the active one. It
    # lapses by the database's clock; every server that takes it raises the epoch, and every
    # write of the active server checks that the epoch is still its own (see Leadership).
    """
    CREATE TABLE lease (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        expires TIMESTAMPTZ NOT NULL
    );
    INSERT INTO lease VALUES (1, '', 0, to_timestamp(0));
    """
)

MIGRATIONS.append(
    # 3: working directories shipped with jobs, as the SQLite store's version 9 has them.
    """
    CREATE TABLE packages (
        sha256 TEXT PRIMARY KEY,
        size BIGINT NOT NULL,
        touched DOUBLE PRECISION NOT NULL,
        complete INTEGER NOT NULL
    );
    CREATE TABLE package_chunks (
        sha256 TEXT NOT NULL REFERENCES packages(sha256) ON DELETE CASCADE,
        seq BIGINT NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (sha256, seq)
    );
    ALTER TABLE jobs ADD COLUMN package TEXT NOT NULL DEFAULT '';
    CREATE INDEX jobs_package ON jobs(package) WHERE package <> '';
    """
)

MIGRATIONS.append(
    # 4: what a finished job's pods used, as the SQLite store's version 10 has it.
    """
    ALTER TABLE history ADD COLUMN avg_cpu_cores DOUBLE PRECISION;
    ALTER TABLE history ADD COLUMN peak_cpu_cores DOUBLE PRECISION;
    ALTER TABLE history ADD COLUMN peak_memory_bytes BIGINT;
    ALTER TABLE history ADD COLUMN avg_gpu_utilization DOUBLE PRECISION;
    ALTER TABLE history ADD COLUMN peak_gpu_memory_bytes BIGINT;
    """
)

MIGRATIONS.append(
    # 5: the cluster's key for job tokens, as the SQLite store's version 11 has it
    # (gen_random_uuid draws from the server's strong random source).
    """
    ALTER TABLE cluster ADD COLUMN job_key TEXT NOT NULL DEFAULT '';
    UPDATE cluster SET job_key = replace(gen_random_uuid()::text || gen_random_uuid()::text,
                                         '-', '');
    """
)

MIGRATIONS.append(
    # 6: jobs' last confirmed checkpoint and queues' minRunSeconds, as the SQLite store's
    # version 12 has them.
    """
    ALTER TABLE jobs ADD COLUMN checkpoint_time DOUBLE PRECISION;
    ALTER TABLE queues ADD COLUMN min_run_s DOUBLE PRECISION NOT NULL DEFAULT 0;
    """
)

MIGRATIONS.append(
    # 7: who may read each package, as the SQLite store's version 13 has it.
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
    # 8: each recorded job's outcome and its pods' exits, as the SQLite store's version 14
    # has them (old records' outcome derived from stage and reason alike).
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
    # 9: which agent holds each node's name, as the SQLite store's version 15 has it.
    """
    ALTER TABLE nodes ADD COLUMN agent_id TEXT NOT NULL DEFAULT '';
    """
)

MIGRATIONS.append(
    # 10: experiments, the experiment of jobs and history records, and reported values, as
    # the SQLite store's version 16 has them.
    """
    CREATE TABLE experiments (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        owner TEXT NOT NULL,
        queue TEXT NOT NULL,
        spec TEXT NOT NULL,
        submit_time DOUBLE PRECISION NOT NULL,
        members BIGINT NOT NULL
    );
    ALTER TABLE jobs ADD COLUMN experiment TEXT NOT NULL DEFAULT '';
    CREATE INDEX jobs_experiment ON jobs(experiment) WHERE experiment <> '';
    ALTER TABLE history ADD COLUMN experiment TEXT NOT NULL DEFAULT '';
    CREATE INDEX history_experiment ON history(experiment, end_time, id) WHERE experiment <> '';
    CREATE TABLE report_points (
        job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        step BIGINT NOT NULL,
        value DOUBLE PRECISION NOT NULL,
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
    # 11: each job's exit-code retries and each queue's idleGpuStopMinutes, as the SQLite
    # store's version 17 has them.
    """
    ALTER TABLE jobs ADD COLUMN retries TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE queues ADD COLUMN idle_gpu_stop_s DOUBLE PRECISION NOT NULL DEFAULT 0;
    """
)
