"""population: the rules of population-based training, with no I/O: whom a member copies
(exploit) and how it changes the copied hyperparameters (explore).

A member's standing is its mean return at a step, the learning rate it trained with and
where its checkpoint is. Members are ranked by mean return, ties broken by index (the lower
index ranks higher), so a ranking is a total order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from arranger.job import Peer

FRACTION = 0.25  # the bottom quarter copies the best
FACTORS = (0.8, 1.25)  # explore: the copied learning rate times one of these
MIN_LR, MAX_LR = 1e-5, 0.5
FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Standing:
    """Standing: one member's place in the population at a step."""

    index: int
    step: int
    mean_return: float
    lr: float
    checkpoint: str = ""


def standing_of(peer: Peer) -> Standing | None:
    """standing_of: a peer's standing as it reported it (None until it reported a mean
    return, a learning rate and a checkpoint)."""
    mean, lr, path = (
        peer.latest.get("mean_return"),
        peer.latest.get("lr"),
        peer.notes.get("checkpoint"),
    )
    if mean is None or lr is None or not path:
        return None
    return Standing(peer.index, peer.step, mean, lr, path)


def caught_up(peers: Iterable[Peer], step: int) -> bool:
    """caught_up: whether every peer has reported `step` or later, or has ended."""
    return all(p.step >= step or p.stage in FINISHED for p in peers)


def ranked(standings: Iterable[Standing]) -> list[Standing]:
    """ranked: best first (see the module)."""
    return sorted(standings, key=lambda s: (-s.mean_return, s.index))


def exploit_target(
    me: Standing, others: Sequence[Standing], fraction: float = FRACTION
) -> Standing | None:
    """exploit_target: the member `me` copies, or None. It copies the best of all when it is
    among the worst `fraction` (at least the worst one, with two or more members) and that
    best did strictly better; only standings of `me`'s step or later are compared."""
    population = ranked([me, *(s for s in others if s.step >= me.step and s.index != me.index)])
    if len(population) < 2:
        return None
    bottom = population[-max(1, math.floor(len(population) * fraction)) :]
    best = population[0]
    if me not in bottom or best.mean_return <= me.mean_return:
        return None
    return best


def explored(lr: float, rng: np.random.Generator) -> float:
    """explored: a learning rate near `lr` (times one of FACTORS), kept within
    [MIN_LR, MAX_LR]."""
    factor = FACTORS[int(rng.integers(len(FACTORS)))]
    return min(MAX_LR, max(MIN_LR, lr * factor))
