"""job_tokens: the token every pod of a job gets, good for that job only and while it lives.

A job token is `arj_<job id>_<mac>`, the mac an HMAC-SHA256 of the job id under the cluster's
job key (kept in the store, so every server of the cluster checks it alike and a restarted
server still accepts the tokens its pods hold). Nothing is stored per token.

The token names a principal of its own kind (`job`), acting for the job's owner but confined to
the job: it may read the job, watch it, scale it, confirm a checkpoint, report values, and read its
experiment and its members' reports (JOB_METHODS), and nothing else; it stops working the moment the job ends (finished, stopped or deleted), and the
streams it opened end with it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Iterable

from arranger.identity import Principal, Role
from arranger.security import JOB_TOKEN_PREFIX, OpenStreams, token_hash
from arranger.server.model import JobRecord

SERVICE = "/arranger.v1.Arranger/"
# Longer than any token made here (`arj_`, a 12-digit id, `_`, a 43-character mac): a longer
# one is refused before any work is spent on it.
MAX_TOKEN_CHARS = 128
# What a job token may call (each on its own job only).
JOB_METHODS = frozenset(
    SERVICE + name
    for name in (
        "GetJob",
        "WatchJobs",
        "ScaleJob",
        "ConfirmCheckpoint",
        "ReportValues",  # its own job's values
        "GetReports",  # its own job's, or its experiment's members'
        "GetExperiment",  # its own experiment
    )
)


class JobTokens:
    """JobTokens makes and checks job tokens with the cluster's `key` (hex); `job` finds a job
    in memory by id."""

    methods = JOB_METHODS

    def __init__(self, job: Callable[[str], JobRecord | None]) -> None:
        self._key = b""  # none until the store is open: no token is good
        self._job = job
        self.api = ""  # where pods reach the API (ARRANGER_API)
        self.ca = ""  # the CA that signed the API's certificate, PEM in base64 ("": no TLS)

    def open(self, key: str, api: str, ca_pem: bytes | None) -> None:
        """open sets the cluster's job key (hex, from the store), the API's address as pods
        reach it, and the CA its certificate is signed by (None: plain gRPC)."""
        self._key = bytes.fromhex(key)
        self.api = api
        self.ca = base64.b64encode(ca_pem).decode() if ca_pem else ""

    def pod_env(self, job_id: str) -> dict[str, str]:
        """pod_env: what every pod of the job gets to reach the API as the job."""
        env = {"ARRANGER_API": self.api, "ARRANGER_JOB_TOKEN": self.token(job_id)}
        if self.ca:
            env["ARRANGER_API_CA"] = self.ca
        return env

    def ended(self, job_ids: Iterable[str], streams: OpenStreams) -> None:
        """ended ends the streams the tokens of these jobs opened (the jobs have ended)."""
        for job_id in job_ids:
            streams.revoke(self.digest(job_id))

    def token(self, job_id: str) -> str:
        """token: the token of the job with this id."""
        return f"{JOB_TOKEN_PREFIX}{job_id}_{self._mac(job_id)}"

    def digest(self, job_id: str) -> str:
        """digest: the SHA-256 of the job's token (what its streams are counted by)."""
        return token_hash(self.token(job_id))

    def identify(self, token: str) -> Principal | None:
        """identify: the principal of a job token, None unless it is one this cluster made for
        a job that still lives."""
        if not (
            self._key
            and len(token) <= MAX_TOKEN_CHARS
            and token.isascii()
            and token.startswith(JOB_TOKEN_PREFIX)
        ):
            return None
        # The id is hex and the mac base64url, which may hold "_": the id ends at the first.
        job_id, _, mac = token[len(JOB_TOKEN_PREFIX) :].partition("_")
        if not job_id or not hmac.compare_digest(mac, self._mac(job_id)):
            return None
        job = self._job(job_id)
        if job is None or not job.active:
            return None
        return Principal(job.owner, Role.USER, kind="job", token=token_hash(token), job=job_id)

    def _mac(self, job_id: str) -> str:
        mac = hmac.new(self._key, f"job:{job_id}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
