"""LoginThrottle alone, on a clock the test moves: tries come back one per REFILL_S, an IPv6
client is its /64, and the buckets kept stay bounded. test_dashboard_hostile has it at the
dashboard's login over real HTTP."""

from __future__ import annotations

import pytest

from arranger.server import login_throttle
from arranger.server.login_throttle import REFILL_S, TRIES, LoginThrottle, client


def test_tries_come_back_one_per_refill() -> None:
    now = [0.0]
    throttle = LoginThrottle(lambda: now[0])
    for _ in range(TRIES):
        assert throttle.wait_s("10.0.0.1") == 0
        throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == REFILL_S
    assert throttle.wait_s("10.0.0.2") == 0  # another client's bucket is full
    now[0] += REFILL_S - 1
    assert throttle.wait_s("10.0.0.1") == 1
    now[0] += 1
    assert throttle.wait_s("10.0.0.1") == 0
    throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == REFILL_S
    now[0] += TRIES * REFILL_S  # full again: nothing of it is kept
    assert throttle.wait_s("10.0.0.1") == 0 and not throttle._buckets


def test_a_client_is_its_address_or_its_ipv6_64() -> None:
    assert client("192.0.2.7") == "192.0.2.7"
    assert client("::ffff:192.0.2.7") == "192.0.2.7"
    assert client("2001:db8:1:2:aaaa::1") == client("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client("2001:db8:1:3::1") != client("2001:db8:1:2::1")
    assert client("") == ""  # no address: all such share one bucket


def test_the_buckets_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(login_throttle, "MAX_CLIENTS", 3)
    throttle = LoginThrottle(lambda: 0.0, tries=1)
    for n in range(5):
        throttle.failed(f"10.0.0.{n}")
    assert list(throttle._buckets) == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]  # the newest
    assert throttle.wait_s("10.0.0.4") > 0 and throttle.wait_s("10.0.0.0") == 0
