"""checkpoint: the learner's state in one file, written atomically and read back at start.

A checkpoint holds what the learner needs to go on where it stopped: the policy's weights,
Adam's moment estimates and step count, the updates applied (`version`) and episodes seen,
the returns of the last window of episodes, the seconds trained so far and the scale rule's
mark (see elastic.ScaleRule). It is JSON, which keeps every float exactly (Python writes the
shortest repr that reads back to the same double).

`save` writes a temporary file in the same directory, flushes it to disk and renames it over
the previous checkpoint, then flushes the directory: a reader finds the old checkpoint or the
new one, never part of one, even when the learner is killed while it writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from arranger.examples.cartpole.policy import PARAM_NAMES, Weights

FILE_NAME = "cartpole-learner.ckpt.json"
FORMAT = 1


class CheckpointError(ValueError):
    """CheckpointError: the file is not a checkpoint this learner can resume from."""


@dataclass
class LearnerState:
    """LearnerState: the learner at one moment. `weights`, `adam_m` and `adam_v` have the
    policy's shapes; `returns` are the last window's episode returns, oldest first;
    `scale_mark` is (version, average return) where the scale rule last looked."""

    weights: Weights
    adam_m: Weights
    adam_v: Weights
    adam_t: int
    version: int
    episodes: int
    returns: list[float]
    seconds: float = 0.0
    scale_mark: tuple[int, float] = (0, 0.0)


def path_in(directory: Path) -> Path:
    """path_in: where the checkpoint lies in `directory`."""
    return directory / FILE_NAME


def save(directory: Path, state: LearnerState) -> Path:
    """save writes `state` as the directory's checkpoint, atomically (see the module's
    docstring), and returns its path. The directory is made if missing."""
    directory.mkdir(parents=True, exist_ok=True)
    body = {
        "format": FORMAT,
        "weights": _arrays_out(state.weights),
        "adam_m": _arrays_out(state.adam_m),
        "adam_v": _arrays_out(state.adam_v),
        "adam_t": state.adam_t,
        "version": state.version,
        "episodes": state.episodes,
        "returns": list(state.returns),
        "seconds": state.seconds,
        "scale_mark": list(state.scale_mark),
    }
    target = path_in(directory)
    fd, temp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _sync_directory(directory)
    return target


def load(directory: Path, hidden: int) -> LearnerState | None:
    """load reads the directory's checkpoint (None when there is none). It raises
    CheckpointError when the file is unreadable or its weights are not shaped for a policy
    with `hidden` units."""
    path = path_in(directory)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    try:
        body = json.loads(text)
        if body.get("format") != FORMAT:
            raise CheckpointError(f"{path}: format {body.get('format')!r}, not {FORMAT}")
        shapes = {"w1": (4, hidden), "b1": (1, hidden), "w2": (hidden, 2), "b2": (1, 2)}
        mark_version, mark_average = body["scale_mark"]
        return LearnerState(
            weights=_arrays_in(body["weights"], shapes),
            adam_m=_arrays_in(body["adam_m"], shapes),
            adam_v=_arrays_in(body["adam_v"], shapes),
            adam_t=int(body["adam_t"]),
            version=int(body["version"]),
            episodes=int(body["episodes"]),
            returns=[float(r) for r in body["returns"]],
            seconds=float(body["seconds"]),
            scale_mark=(int(mark_version), float(mark_average)),
        )
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: {exc!r}") from exc


def remove(directory: Path) -> None:
    """remove deletes the directory's checkpoint, if there is one."""
    path_in(directory).unlink(missing_ok=True)


def _arrays_out(arrays: Weights) -> dict[str, Any]:
    return {name: arrays[name].tolist() for name in PARAM_NAMES}


def _arrays_in(raw: dict[str, Any], shapes: dict[str, tuple[int, int]]) -> Weights:
    """_arrays_in converts nested lists back to float64 arrays of the expected shapes."""
    out: Weights = {}
    for name in PARAM_NAMES:
        array = np.asarray(raw[name], dtype=np.float64)
        if array.shape != shapes[name]:
            raise CheckpointError(f"{name} has shape {array.shape}, not {shapes[name]}")
        out[name] = array
    return out


def _sync_directory(directory: Path) -> None:
    """_sync_directory flushes the rename to disk (where the filesystem allows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
