"""CartPole: a distributed reinforcement-learning example job for Arranger.

One learner (the job's leader) trains a small softmax-MLP policy with policy gradient;
its actors (the job's workers) play CartPole with its latest weights. They talk over TCP
with length-prefixed JSON messages (see wire.py):

1. actor -> learner: {"rank": r}                                     (hello, once)
2. learner -> actor: {"version": v, "weights": {...}}
3. actor -> learner: {"version": v, "episodes": [{"obs", "actions", "rewards"}, ...],
                      "returns": [...]}
4. repeat from 2.

The learner applies each batch as it arrives (it may be a few versions stale), prints
progress, and when the mean return over the last --window episodes reaches --target it
prints `solved: ...`, closes every actor connection and exits 0; an actor that sees its
connection closed exits 0. The learner exits 1 if --max-seconds pass first. An actor may
come and go at any time: the learner trains with whoever is connected (see learner.py).

Under Arranger (job.yaml) the learner also uses the in-job SDK (arranger.job; see
elastic.py):

- Elastic actors: the job starts with 2 actors (`counts`) and may have 6 (`maxCounts`).
  Every --scale-every updates (20) the learner compares its average return with the last
  look; when it rose by less than --scale-min-gain (10), every actor wanted is connected and
  fewer than maxCounts are wanted, it asks for one more (job.scale).
- Eviction notices: with `evictionNoticeSeconds: 30`, a job that the scheduler evicts as a
  whole (a higher-priority job needs its room) is told first. The learner, on the event
  `job-evicting`, writes a checkpoint (checkpoint.py: weights, Adam state, step counters,
  recent returns; atomically) and answers job.checkpointed(), so the eviction goes ahead at
  once instead of after 30 s. SIGTERM (an eviction without notice, a stop) and SIGINT also
  make it checkpoint before it exits 128 + the signal, within `preemptionGraceSeconds`.
  When the job is placed again the new learner resumes from the checkpoint and logs
  `learner: resumed from checkpoint PATH at version=N ...`.

Where the checkpoint lives, and what that means: by default the pod's scratch directory
($ARRANGER_SCRATCH_DIR). An agent keeps one scratch directory per pod, not per attempt
(`<agent data dir>/scratch/<job id>/<pod name>/`), and removes it only when the job ends
under cleanPodPolicy All, or is deleted: an eviction keeps it (its kill order does not ask to
remove it). But it lies on the node that ran the pod, and the scheduler has no preference for
a pod's previous node: the checkpoint survives an eviction only if the learner is placed on
the same node again. Elsewhere the learner finds none, says "no checkpoint in ...", and
starts afresh. Two honest ways to keep it:

- pin the learner to one node with `nodeSelector` (it then waits for room on that node);
  the end-to-end test runs on a one-node cluster, where the learner always comes back; or
- checkpoint to storage every node sees: a volume on a shared filesystem, e.g.
  `--checkpoint-dir '$ARRANGER_VOLUME_CKPT/$ARRANGER_JOB_ID'` (no shell runs the command:
  the learner expands the variables itself; the job id stays the same across evictions).

- Progress: the learner reports its version and average return (job.report) once per update
  and heartbeats while it waits (job.heartbeat): with `progressTimeoutSeconds: 120` and
  `onStall: restart` a learner whose loop hangs is restarted (and resumes from its
  checkpoint).
- A helper role: the `evaluator` set (evaluator.py) is `auxiliary`: it connects as an actor
  that evaluates (hello `{"evaluates": true}`), plays greedy episodes with each version it is
  sent and reports `eval_return`, and the learner never learns from it nor counts it as an
  actor. It starts once the learner said it is ready (`startAfter: leaderReady`), is in no
  gang minimum, and gets `terminationDelaySeconds: 10` after the learner ends.

`--pause-at-version N` stops a learner that started afresh after N updates, its actors
parked, until it is evicted or stopped: a fixed point to try eviction and resume at.
"""
