"""Tests of the CartPole example: physics, wire framing, the policy gradient, and a
real learner plus four actors training to a target over TCP."""

from __future__ import annotations

import importlib.util
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

import numpy as np
import pytest

from arranger.examples.cartpole import wire
from arranger.examples.cartpole.env import MAX_STEPS, THETA_LIMIT, CartPole, Obs
from arranger.examples.cartpole.policy import (
    Episode,
    PolicyGradient,
    action_probs,
    init_weights,
    rewards_to_go,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def hard_timeout(seconds: int) -> Callable[[T], T]:
    """hard_timeout marks a test with pytest-timeout's limit when that plugin is installed."""
    if importlib.util.find_spec("pytest_timeout") is None:
        return lambda fn: fn
    # MarkDecorator's overloaded __call__ returns its argument for a plain function.
    return cast("Callable[[T], T]", pytest.mark.timeout(seconds))


# --- env -------------------------------------------------------------------------------


def run_episode(env: CartPole, policy: Callable[[Obs], int]) -> tuple[int, float, bool, bool]:
    """run_episode plays policy(obs) -> action to the end; returns (steps, reward sum, flags)."""
    obs = env.reset()
    steps, total = 0, 0.0
    while True:
        obs, reward, terminated, truncated = env.step(policy(obs))
        steps += 1
        total += reward
        if terminated or truncated:
            return steps, total, terminated, truncated


def test_always_pushing_right_topples_the_pole_quickly() -> None:
    env = CartPole(np.random.default_rng(0))
    steps, total, terminated, truncated = run_episode(env, lambda _obs: 1)
    assert terminated and not truncated
    assert 5 <= steps <= 20
    assert total == steps
    # Pushing the cart right makes the pole fall left (negative theta).
    assert env.state[2] < -THETA_LIMIT


def test_fixed_action_sequence_terminates_and_reward_equals_steps() -> None:
    env = CartPole(np.random.default_rng(1))
    actions = itertools.cycle([1, 1, 0])  # pushes right on average, so the pole falls left
    steps, total, terminated, truncated = run_episode(env, lambda _obs: next(actions))
    assert terminated and not truncated
    assert 10 <= steps < MAX_STEPS
    assert total == steps


def test_balancing_controller_is_truncated_at_500_steps() -> None:
    env = CartPole(np.random.default_rng(2))

    def controller(obs: Obs) -> int:
        x, x_dot, theta, theta_dot = obs
        return 1 if theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0 else 0

    steps, total, terminated, truncated = run_episode(env, controller)
    assert (steps, total, terminated, truncated) == (MAX_STEPS, float(MAX_STEPS), False, True)


def test_first_step_from_rest_matches_hand_computed_dynamics() -> None:
    env = CartPole(np.random.default_rng(0))
    env.state = (0.0, 0.0, 0.0, 0.0)
    (x, x_dot, theta, theta_dot), reward, terminated, truncated = env.step(1)
    # temp = F/M_total; theta_acc = -temp / (l (4/3 - m_pole/M_total)); x_acc follows.
    temp = 10.0 / 1.1
    theta_acc = -temp / (0.5 * (4.0 / 3.0 - 0.1 / 1.1))
    x_acc = temp - 0.05 * theta_acc / 1.1
    assert (x, theta) == (0.0, 0.0)  # Euler moves positions with the old velocities
    assert x_dot == pytest.approx(0.02 * x_acc)
    assert theta_dot == pytest.approx(0.02 * theta_acc)
    assert (reward, terminated, truncated) == (1.0, False, False)


def test_reset_is_seeded_and_small() -> None:
    a = CartPole(np.random.default_rng(7)).reset()
    b = CartPole(np.random.default_rng(7)).reset()
    assert a == b
    assert all(abs(v) <= 0.05 for v in a)


# --- wire ------------------------------------------------------------------------------


def test_wire_round_trip_over_socketpair() -> None:
    left, right = socket.socketpair()
    with left, right:
        msg = {"version": 3, "weights": {"w": [[0.5, -1.25]]}, "text": "héllo"}
        wire.send_msg(left, msg)
        wire.send_msg(left, {"rank": 0})
        assert wire.recv_msg(right) == msg
        assert wire.recv_msg(right) == {"rank": 0}


def test_wire_large_message_crosses_many_recv_calls() -> None:
    left, right = socket.socketpair()
    msg = {"obs": [[float(i)] * 4 for i in range(50_000)]}  # a few MB, beyond socket buffers
    with left, right:
        sender = threading.Thread(target=wire.send_msg, args=(left, msg))
        sender.start()
        assert wire.recv_msg(right) == msg
        sender.join()


def test_wire_eof_between_and_inside_messages_raises_connection_closed() -> None:
    left, right = socket.socketpair()
    with right:
        left.close()
        with pytest.raises(wire.ConnectionClosed):
            wire.recv_msg(right)
    left, right = socket.socketpair()
    with right:
        left.sendall(wire.HEADER.pack(10) + b'{"a"')
        left.close()
        with pytest.raises(ConnectionError):
            wire.recv_msg(right)


@pytest.mark.parametrize("body", [b"not json", b"\xff\xfe", b"[1, 2]"])
def test_wire_rejects_bodies_that_are_not_json_objects(body: bytes) -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(wire.HEADER.pack(len(body)) + body)
        with pytest.raises(wire.ProtocolError):
            wire.recv_msg(right)


def test_wire_rejects_oversized_length() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(wire.HEADER.pack(wire.MAX_MESSAGE_BYTES + 1))
        with pytest.raises(wire.ProtocolError):
            wire.recv_msg(right)


# --- policy ----------------------------------------------------------------------------


def test_rewards_to_go() -> None:
    assert rewards_to_go([1.0, 1.0, 1.0], 0.5).tolist() == [1.75, 1.5, 1.0]


def test_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    pg = PolicyGradient(init_weights(rng, hidden=5))
    episodes = [
        Episode(
            obs=rng.normal(size=(n, 4)).tolist(),
            actions=rng.integers(0, 2, n).tolist(),
            rewards=[1.0] * n,
        )
        for n in (3, 6)
    ]
    obs = np.asarray([o for ep in episodes for o in ep.obs])
    actions = np.asarray([a for ep in episodes for a in ep.actions])
    adv = np.concatenate([rewards_to_go(ep.rewards, pg.gamma) for ep in episodes])
    adv = (adv - adv.mean()) / adv.std()

    def objective() -> float:
        probs = action_probs(pg.weights, obs)[1]
        return float(np.mean(adv * np.log(probs[np.arange(len(actions)), actions])))

    grad = pg.gradient(episodes)
    for name, value in pg.weights.items():
        numeric = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            saved = value[idx]
            value[idx] = saved + 1e-6
            up = objective()
            value[idx] = saved - 1e-6
            down = objective()
            value[idx] = saved
            numeric[idx] = (up - down) / 2e-6
        np.testing.assert_allclose(grad[name], numeric, atol=1e-6, err_msg=name)
    # With the behavior policy equal to the current one, no ratio is clipped.
    for name, g in pg.gradient(episodes, dict(pg.weights)).items():
        np.testing.assert_allclose(g, grad[name], atol=1e-12)


# --- end to end ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spawn(args: list[str], extra_env: dict[str, str]) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra_env)
    return subprocess.Popen(
        [sys.executable, "-m", "arranger.examples.cartpole", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@hard_timeout(120)
def test_learner_and_four_actors_reach_target_over_tcp() -> None:
    port = free_port()
    procs: list[subprocess.Popen[str]] = []
    try:
        learner = spawn(
            ["learner", "--target", "100", "--max-seconds", "90"],
            {"ARRANGER_ROLE": "leader", "ARRANGER_PORT_RPC": str(port)},
        )
        procs.append(learner)
        actors = [
            spawn(
                ["actor"],
                {
                    "ARRANGER_ROLE": "worker",
                    "ARRANGER_LEADER_ADDR": f"127.0.0.1:{port}",
                    "ARRANGER_WORKER_RANK": str(rank),
                    "ARRANGER_NUM_WORKERS": "4",
                },
            )
            for rank in range(4)
        ]
        procs.extend(actors)

        out, err = learner.communicate(timeout=100)
        assert learner.returncode == 0, f"learner failed:\n{out}\n{err}"
        assert "Traceback" not in err, err
        assert any(line.startswith("solved: ") for line in out.splitlines()), out

        for rank, actor in enumerate(actors):
            a_out, a_err = actor.communicate(timeout=10)
            assert actor.returncode == 0, f"actor {rank} failed:\n{a_out}\n{a_err}"
            assert "Traceback" not in a_err, a_err
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()


def test_actor_without_learner_exits_1_after_connect_timeout() -> None:
    actor = spawn(
        ["actor", "--connect-timeout", "0.5"],
        {"ARRANGER_LEADER_ADDR": f"127.0.0.1:{free_port()}", "ARRANGER_WORKER_RANK": "0"},
    )
    try:
        _, err = actor.communicate(timeout=30)
        assert actor.returncode == 1
        assert "could not connect to learner" in err
    finally:
        if actor.poll() is None:
            os.killpg(actor.pid, signal.SIGKILL)
            actor.communicate()


def test_packaged_job_spec_matches_the_examples_copy() -> None:
    yaml = pytest.importorskip("yaml")
    packaged = REPO_ROOT / "arranger" / "examples" / "cartpole" / "job.yaml"
    copy = REPO_ROOT / "examples" / "cartpole.yaml"
    spec = yaml.safe_load(packaged.read_text())
    assert yaml.safe_load(copy.read_text()) == spec
    assert spec["spec"]["leader"]["template"]["ports"] == [{"name": "rpc"}]
