"""actions are the steps of a cycle; importing this package registers them.

enqueue admits jobs whose minimum could be placed at all; allocate places gang minimums,
queue-fairly; preempt and reclaim evict running pods for minimums that do not fit; backfill
places the pods above the minimums; reserve locks nodes for a job that waited too long.
"""

from arranger.sched.actions import allocate, backfill, enqueue, preempt, reserve

__all__ = ["allocate", "backfill", "enqueue", "preempt", "reserve"]
