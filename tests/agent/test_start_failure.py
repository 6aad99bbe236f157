"""start_failure reads podman's exit and its words as a pod's reason: a pull that failed is
ImagePullFailed with podman's last line, bounded; the rest as before."""

from __future__ import annotations

from arranger.agent.start_failure import SAID_CHARS, podman_run


def test_a_failed_pull_is_named_with_podmans_last_line() -> None:
    output = "Trying to pull example.org/x:1...\nError: initializing source: denied\n"
    reason = podman_run(
        125, "Error: initializing source: denied", "python", output, "example.org/x:1"
    )
    assert reason == "ImagePullFailed: image example.org/x:1: Error: initializing source: denied"


def test_what_podman_said_is_bounded() -> None:
    said = "Error: " + "x" * 10_000
    reason = podman_run(125, said, "python", f"Trying to pull y...\n{said}\n", "y")
    assert reason.startswith("ImagePullFailed: image y: Error: xxx")
    assert len(reason) <= len("ImagePullFailed: image y: ") + SAID_CHARS
    assert podman_run(125, said, "python") == f"ContainerError: {said[:SAID_CHARS]}"


def test_other_exits_keep_their_kinds() -> None:
    assert podman_run(127, "no such file", "run").startswith("ContainerCommandNotFound: ")
    assert podman_run(126, "", "run") == "ContainerCannotRun: cannot start `run`: podman exit 126"
    assert podman_run(125, "Error: bad flag", "run", "Error: bad flag\n") == (
        "ContainerError: Error: bad flag"
    )
