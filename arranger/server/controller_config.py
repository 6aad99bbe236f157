"""controller_config: the timings and choices of the controller's state machine."""

from __future__ import annotations

from dataclasses import dataclass

from arranger.spec import JobSpec


@dataclass(frozen=True)
class ControllerConfig:
    """ControllerConfig: restart back-off doubles from `backoff_initial_s` up to `backoff_max_s`;
    `kill_grace_s` is the time between SIGTERM and SIGKILL; `node_timeout_s` is how long a silent
    node keeps its pods before they are Lost. Without fencing (`replace_lost_pods` false) a
    silent node's pods are never replaced: they may still be running. An evicted pod gets its
    job's preemptionGraceSeconds between SIGTERM and SIGKILL, at most `max_preemption_grace_s`,
    after its evictionNoticeSeconds of notice, at most `max_eviction_notice_s`. A submit asking
    for more is refused (`above_maxima`); the caps at use hold jobs stored before a lower
    maximum was configured. The last `story_length` transitions of jobs and pods are kept (see
    arranger.server.transitions). A pod whose exit code its spec lists in retryOnExitCodes
    restarts without spending restartLimit up to `transient_retry_limit` times (per leader, per
    worker set)."""

    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    kill_grace_s: float = 10.0
    node_timeout_s: float = 330.0
    replace_lost_pods: bool = True
    max_preemption_grace_s: float = 300.0
    max_eviction_notice_s: float = 300.0
    story_length: int = 100_000  # a few cycles' worth of 10,000 pods placed and run
    transient_retry_limit: int = 5

    def preemption_grace(self, spec: JobSpec) -> float:
        """preemption_grace: the job's preemptionGraceSeconds (else killGrace), capped."""
        wanted = (
            spec.preemption_grace_s if spec.preemption_grace_s is not None else self.kill_grace_s
        )
        return min(wanted, self.max_preemption_grace_s)

    def eviction_notice(self, spec: JobSpec) -> float:
        """eviction_notice: the job's evictionNoticeSeconds, capped."""
        return min(spec.eviction_notice_s, self.max_eviction_notice_s)

    def above_maxima(self, spec: JobSpec) -> list[str]:
        """above_maxima: the job's times this server would cut short, each naming its field."""
        asked = (
            ("preemptionGraceSeconds", spec.preemption_grace_s, self.max_preemption_grace_s),
            ("evictionNoticeSeconds", spec.eviction_notice_s, self.max_eviction_notice_s),
        )
        return [
            f"spec.{field}: {_seconds(seconds)} is above this server's maximum of "
            f"{_seconds(most)} (max{field[0].upper()}{field[1:]})"
            for field, seconds, most in asked
            if seconds is not None and seconds > most
        ]


def _seconds(value: float) -> str:
    """_seconds: a number of seconds as written (1234567, 300.5, 300.0000001), never rounded."""
    return str(int(value)) if value == int(value) else repr(value)
