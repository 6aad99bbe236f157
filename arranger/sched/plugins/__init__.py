"""plugins are the scheduler's policies, one module each, named after the plugin; importing this
package registers all of them.

| name | registers |
|---|---|
| priority | job order: higher priority first |
| drf | job order: lower dominant share first, for jobs asking jobQueuePolicy DRF |
| gang | the gang minimum: leader + minWorkersNum workers (every pod with basicPolicy Gang) |
| proportion | queue deserved shares, queue order, queue capability |
| predicates | node filters: ready and not cordoned, nodeSelector, gpuType, scarce GPUs, machine groups |
| binpack | the BinPack (and Gang) score |
| leaderfirst | the LeaderFirst score |
| minfragment | the MinFragment score and its GPU choice for shares |
| affinity | the JobAffinity and JobAntiAffinity scores |
| gpupreference | a bonus for nodes with the pod's preferredGpuType |
"""

from arranger.sched.plugins import (
    affinity,
    binpack,
    drf,
    gang,
    gpupreference,
    leaderfirst,
    minfragment,
    predicates,
    priority,
    proportion,
)

__all__ = [
    "affinity",
    "binpack",
    "drf",
    "gang",
    "gpupreference",
    "leaderfirst",
    "minfragment",
    "predicates",
    "priority",
    "proportion",
]
