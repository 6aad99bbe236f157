"""PBT: population-based training of CartPole policies, one sweep member per member of the
population, through the in-job SDK (arranger.job).

The job is a sweep (job.yaml: `spec.sweep` over the learning rate, four members), so each
member is a job of its own, `pbt-0` .. `pbt-3`, and Arranger places, retries and accounts
each. Every member trains a small policy on CartPole alone (the cartpole example's policy,
environment and checkpoints, without actors), in rounds:

1. train `--updates-per-round` policy-gradient updates;
2. save a checkpoint to shared storage, report its mean return and learning rate
   (`job.report(step, mean_return=..., lr=...)`) and publish the checkpoint's path
   (`job.publish(checkpoint=...)`);
3. wait (at most `--peer-wait-s`) until every peer has reported this round too, reading
   them with `job.peers()`: the rounds stay in step, so that members are compared at the
   same amount of training;
4. exploit and explore: a member in the bottom quarter of the members' mean returns
   (truncation selection; at least the worst one of two or more) whose best peer did better
   loads that peer's checkpoint (weights and Adam state) and takes its learning rate
   multiplied by 0.8 or 1.25 (drawn from a generator seeded by the member and the round). It
   logs `pbt: round R: exploit member I ...` and reports `exploited_from` (the index) and the
   new `lr` at the same step.

After `--rounds` rounds the member exits 0 (training alone when it is no sweep member).
`arranger get pbt` shows each member's latest mean return and checkpoint.

Checkpoints go to `--checkpoints` (default `$ARRANGER_VOLUME_CKPT/arranger-pbt`), one
directory per member (its job id), written atomically: the members must all see it, so on
several machines it must be storage every node mounts (job.yaml mounts /tmp, which is one
machine's only: right for `arranger dev`). A peer's checkpoint that cannot be read is passed
over, and the member trains on with its own weights.
"""
