"""Policy: a tiny softmax MLP over CartPole's two actions, trained by policy gradient.

The network is obs(4) -> tanh(hidden) -> logits(2). The learner improves it with
REINFORCE on discounted reward-to-go, normalised over each batch (a cheap baseline
that keeps step sizes stable as episodes grow), and Adam. Batches played by an older
version of the policy are reweighted by importance ratios clipped as in PPO, which keeps
learning reliable however many actors feed one learner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
Weights = dict[str, Array]
WireWeights = dict[str, list[list[float]]]

PARAM_NAMES = ("w1", "b1", "w2", "b2")


def init_weights(rng: np.random.Generator, hidden: int = 32) -> Weights:
    """init_weights returns small random weights; b2 = 0 so both actions start near 50%."""
    return {
        "w1": rng.normal(0.0, 1.0 / np.sqrt(4), (4, hidden)),
        "b1": np.zeros((1, hidden)),
        "w2": rng.normal(0.0, 0.1 / np.sqrt(hidden), (hidden, 2)),
        "b2": np.zeros((1, 2)),
    }


def to_wire(weights: Weights) -> WireWeights:
    """to_wire converts weights to nested lists that JSON can carry."""
    return {name: weights[name].tolist() for name in PARAM_NAMES}


def from_wire(wire: WireWeights) -> Weights:
    """from_wire is the inverse of to_wire."""
    return {name: np.asarray(wire[name], dtype=np.float64) for name in PARAM_NAMES}


def action_probs(weights: Weights, obs: Array) -> tuple[Array, Array]:
    """action_probs maps a (n, 4) batch of observations to (hidden activations, probs)."""
    hidden = np.tanh(obs @ weights["w1"] + weights["b1"])
    logits = hidden @ weights["w2"] + weights["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return hidden, exp / exp.sum(axis=1, keepdims=True)


def sample_action(weights: Weights, obs: Sequence[float], rng: np.random.Generator) -> int:
    """sample_action draws an action from the policy's distribution at one observation."""
    _, probs = action_probs(weights, np.asarray([obs], dtype=np.float64))
    return 1 if rng.random() < probs[0, 1] else 0


def rewards_to_go(rewards: Sequence[float], gamma: float) -> Array:
    """rewards_to_go returns, for each step t, sum_k gamma^k * rewards[t + k]."""
    out = np.empty(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


@dataclass
class Episode:
    """Episode holds one rollout: obs[t] was seen, actions[t] taken, rewards[t] earned."""

    obs: list[list[float]]
    actions: list[int]
    rewards: list[float]


class PolicyGradient:
    """PolicyGradient owns the current weights and the Adam state that updates them: the
    moment estimates `m` and `v` (shaped like the weights) and `t`, the steps taken."""

    def __init__(
        self, weights: Weights, lr: float = 0.005, gamma: float = 0.99, clip: float = 0.2
    ) -> None:
        self.weights = weights
        self.lr = lr
        self.gamma = gamma
        self.clip = clip
        self.m = {k: np.zeros_like(v) for k, v in weights.items()}
        self.v = {k: np.zeros_like(v) for k, v in weights.items()}
        self.t = 0

    def gradient(self, episodes: Sequence[Episode], behavior: Weights | None = None) -> Weights:
        """gradient is d/dθ of the batch's mean clipped surrogate objective.

        With ratio_t = π(a_t|s_t) / μ(a_t|s_t), where μ (behavior) is the stale policy
        that played the episodes, a step contributes ratio_t * adv_t * ∇log π, except that
        it contributes nothing once the ratio has already moved past 1 ± clip in the
        advantage's direction (PPO's clip). Without behavior, μ = π and this is REINFORCE.
        """
        obs = np.asarray([o for ep in episodes for o in ep.obs], dtype=np.float64)
        actions = np.asarray([a for ep in episodes for a in ep.actions], dtype=np.int64)
        adv = np.concatenate([rewards_to_go(ep.rewards, self.gamma) for ep in episodes])
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        steps = np.arange(len(actions))
        hidden, probs = action_probs(self.weights, obs)
        if behavior is not None:
            ratio = probs[steps, actions] / action_probs(behavior, obs)[1][steps, actions]
            clipped = ((adv > 0) & (ratio > 1 + self.clip)) | ((adv < 0) & (ratio < 1 - self.clip))
            adv = np.where(clipped, 0.0, ratio * adv)
        # d log softmax(a) / d logits = onehot(a) - probs
        d_logits = -probs
        d_logits[steps, actions] += 1.0
        d_logits *= adv[:, None] / len(actions)
        d_hidden = (d_logits @ self.weights["w2"].T) * (1.0 - hidden * hidden)
        return {
            "w1": obs.T @ d_hidden,
            "b1": d_hidden.sum(axis=0, keepdims=True),
            "w2": hidden.T @ d_logits,
            "b2": d_logits.sum(axis=0, keepdims=True),
        }

    def update(self, episodes: Sequence[Episode], behavior: Weights | None = None) -> None:
        """update takes one Adam ascent step on the batch's policy-gradient objective."""
        grad = self.gradient(episodes, behavior)
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        for name, g in grad.items():
            # New arrays, never in place: the learner keeps shallow copies as snapshots.
            self.m[name] = b1 * self.m[name] + (1 - b1) * g
            self.v[name] = b2 * self.v[name] + (1 - b2) * g * g
            m_hat = self.m[name] / (1 - b1**self.t)
            v_hat = self.v[name] / (1 - b2**self.t)
            self.weights[name] = self.weights[name] + self.lr * m_hat / (np.sqrt(v_hat) + eps)
