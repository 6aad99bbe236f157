"""actions are the steps of a cycle; importing this package registers them.

enqueue admits jobs whose minimum could be placed at all; allocate places gang minimums,
queue-fairly; backfill places the pods above the minimums.
"""

from arranger.sched.actions import allocate, backfill, enqueue

__all__ = ["allocate", "backfill", "enqueue"]
