"""accounts decides which local account runs each pod on this node.

Three ways, set in the agent's config: every pod as one configured account (`user: NAME`),
each pod as its job's owner (`runAs: owner`: the local account of the owner's name, looked up
at launch, so an account made after the agent started is found), or, with neither, as the
agent's own user. A pod that would run as root is refused unless the config says runAsRoot;
an owner without an account here, or a pod without an owner, fails to start.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from arranger.agent.config import PodUser
from arranger.agent.runtime import StartError

NOT_STARTED = 126  # the exit code of a pod refused before its program ran


@dataclass(frozen=True)
class Accounts:
    """Accounts: `fixed` runs every pod (None: none configured); `owners`: each pod runs as its
    owner's account instead; `allow_root`: an owner that is root may run pods."""

    node_name: str
    fixed: PodUser | None = None
    owners: bool = False
    allow_root: bool = False

    @property
    def switching(self) -> bool:
        """switching: whether pods may run as users other than the agent's."""
        return self.fixed is not None or self.owners

    def for_pod(self, owner: str) -> PodUser | None:
        """for_pod: the account a pod of `owner` runs as (None: the agent's own user). Raises
        StartError (NoSuchUser, RootRefused) when the pod must not start."""
        if not self.owners:
            return self.fixed
        if not owner:
            raise StartError(
                NOT_STARTED, f"NoSuchUser: the job has no owner to run as on node {self.node_name}"
            )
        try:
            entry = pwd.getpwnam(owner)
        except KeyError:
            raise StartError(
                NOT_STARTED, f"NoSuchUser: no account named {owner!r} on node {self.node_name}"
            ) from None
        if entry.pw_uid == 0 and not self.allow_root:
            raise StartError(
                NOT_STARTED,
                f"RootRefused: the job's owner {owner!r} is root on node {self.node_name}, "
                "and this agent runs no pod as root (runAsRoot)",
            )
        if entry.pw_uid == os.geteuid():
            return None
        return PodUser.of(entry)
