"""CartPole: the classic cart-and-pole balancing task, as in gymnasium's CartPole-v1.

The physics are the Barto/Sutton/Anderson equations integrated with explicit Euler
steps of 0.02 s. An episode terminates when the cart leaves |x| <= 2.4 or the pole
leans more than 12 degrees, and is truncated after 500 steps; every step, including
the last, earns a reward of 1, so an episode's return equals its length.
"""

from __future__ import annotations

import math

import numpy as np

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_CART + MASS_POLE
HALF_LENGTH = 0.5  # gymnasium's "length" is half the pole's length
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
FORCE = 10.0
TAU = 0.02
X_LIMIT = 2.4
THETA_LIMIT = 12 * 2 * math.pi / 360
MAX_STEPS = 500

Obs = tuple[float, float, float, float]


class CartPole:
    """CartPole holds one episode's state: (x, x_dot, theta, theta_dot) and the step count."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self.state: Obs = (0.0, 0.0, 0.0, 0.0)
        self.steps = 0

    def reset(self) -> Obs:
        """reset starts an episode from a state drawn uniformly from [-0.05, 0.05]^4."""
        x, x_dot, theta, theta_dot = (float(v) for v in self._rng.uniform(-0.05, 0.05, 4))
        self.state = (x, x_dot, theta, theta_dot)
        self.steps = 0
        return self.state

    def step(self, action: int) -> tuple[Obs, float, bool, bool]:
        """step pushes the cart right (action 1) or left (0) and returns
        (obs, reward, terminated, truncated)."""
        x, x_dot, theta, theta_dot = self.state
        force = FORCE if action == 1 else -FORCE
        cos_t, sin_t = math.cos(theta), math.sin(theta)
        temp = (force + POLE_MASS_LENGTH * theta_dot * theta_dot * sin_t) / TOTAL_MASS
        theta_acc = (GRAVITY * sin_t - cos_t * temp) / (
            HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * cos_t * cos_t / TOTAL_MASS)
        )
        x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos_t / TOTAL_MASS
        # Explicit Euler, updating positions from the old velocities as gymnasium does.
        x, x_dot = x + TAU * x_dot, x_dot + TAU * x_acc
        theta, theta_dot = theta + TAU * theta_dot, theta_dot + TAU * theta_acc
        self.state = (x, x_dot, theta, theta_dot)
        self.steps += 1
        terminated = abs(x) > X_LIMIT or abs(theta) > THETA_LIMIT
        truncated = not terminated and self.steps >= MAX_STEPS
        return self.state, 1.0, terminated, truncated
