"""The pure rate limiters with an explicit clock."""

from __future__ import annotations

import pytest

from ito.core.rate_limit import FailureWindow, TokenBucket


def test_a_bucket_admits_its_burst_then_its_rate_and_says_how_long_to_wait() -> None:
    bucket = TokenBucket(rate_per_second=2.0, burst=3)
    assert [bucket.take("a", 10.0) for _ in range(3)] == [None, None, None]
    wait = bucket.take("a", 10.0)
    assert wait == pytest.approx(0.5)
    assert bucket.take("b", 10.0) is None  # keys are independent
    assert bucket.take("a", 10.25) == pytest.approx(0.25)  # a refusal spends nothing
    assert bucket.take("a", 10.5) is None
    assert bucket.take("a", 10.5) is not None
    # Idle time refills up to the burst, never beyond it.
    assert [bucket.take("a", 100.0) for _ in range(4)][:3] == [None, None, None]
    assert bucket.take("a", 100.0) is not None


def test_a_bucket_forgets_the_least_recent_key_past_its_bound() -> None:
    bucket = TokenBucket(rate_per_second=0.001, burst=1, max_keys=2)
    assert bucket.take("a", 0.0) is None and bucket.take("b", 0.0) is None
    assert bucket.take("a", 0.0) is not None
    assert bucket.take("c", 0.0) is None  # evicts "b", the least recently seen
    assert bucket.take("b", 0.0) is None  # forgotten: errs towards admitting
    assert bucket.take("a", 0.0) is None  # ...and that evicted "a" in turn


def test_failures_block_a_source_until_the_oldest_leaves_the_window() -> None:
    window = FailureWindow(limit=3, window_seconds=60.0)
    for t in (0.0, 10.0, 20.0):
        assert window.blocked("ip:x", t) is None
        window.fail("ip:x", t)
    assert window.blocked("ip:x", 30.0) == pytest.approx(30.0)
    assert window.blocked("ip:y", 30.0) is None
    assert window.blocked("ip:x", 60.0001) is None  # the failure at 0 s has left the window
    window.fail("ip:x", 61.0)
    assert window.blocked("ip:x", 61.0) == pytest.approx(9.0)


@pytest.mark.parametrize("args", [(0.0, 1), (1.0, 0), (-1.0, 5)])
def test_a_bucket_refuses_nonsense_settings(args: tuple[float, int]) -> None:
    with pytest.raises(ValueError):
        TokenBucket(*args)
