"""CartPole: a distributed reinforcement-learning example job for Arranger.

One learner (the job's leader) trains a small softmax-MLP policy with policy gradient;
N actors (the job's workers) play CartPole with its latest weights. They talk over TCP
with length-prefixed JSON messages (see wire.py):

1. actor -> learner: {"rank": r}                                     (hello, once)
2. learner -> actor: {"version": v, "weights": {...}}
3. actor -> learner: {"version": v, "episodes": [{"obs", "actions", "rewards"}, ...],
                      "returns": [...]}
4. repeat from 2.

The learner applies each batch as it arrives (it may be a few versions stale), prints
progress, and when the mean return over the last --window episodes reaches --target it
prints `solved: ...`, closes every actor connection and exits 0; an actor that sees its
connection closed exits 0. The learner exits 1 if --max-seconds pass first.
"""
