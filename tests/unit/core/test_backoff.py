"""The core retry helper: delays from the definition of exponential backoff (initial * factor**n, capped), jitter
bounds from the stated fraction, and a reset after a success. A fake random source and a fake clock (the sum of
the delays handed out) replace real waiting."""

from __future__ import annotations

import asyncio

import pytest

from accel_core.backoff import Backoff, wait_or_stop


def test_delays_double_up_to_the_cap_without_jitter() -> None:
    b = Backoff(0.5, 30.0, jitter=0.0)
    assert [b.next() for _ in range(9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert b.failures == 9


def test_a_success_resets_to_the_initial_delay() -> None:
    b = Backoff(1.0, 8.0, jitter=0.0)
    [b.next() for _ in range(5)]
    b.reset()
    assert b.failures == 0
    assert [b.next() for _ in range(2)] == [1.0, 2.0]


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 0.8), (0.5, 1.0), (1.0, 1.2)])
def test_jitter_spans_plus_minus_the_fraction(draw: float, factor: float) -> None:
    b = Backoff(2.0, 2.0, jitter=0.2, rand=lambda: draw)
    assert b.next() == pytest.approx(2.0 * factor)


def test_a_flat_backoff_never_grows() -> None:
    b = Backoff(0.5, 0.5, factor=1, jitter=0.0)
    assert {b.next() for _ in range(20)} == {0.5}


def test_fake_clock_outage_of_ten_failures() -> None:
    """Ten failures in a row cost 0.5+1+2+4+8+16+30*4 s on a clock advanced only by the delays; the first retry
    after a success comes 0.5 s later."""
    clock = 0.0
    b = Backoff(0.5, 30.0, jitter=0.0)
    for _ in range(10):
        clock += b.next()
    assert clock == 0.5 + 1 + 2 + 4 + 8 + 16 + 30 * 4
    b.reset()
    before = clock
    clock += b.next()
    assert clock - before == 0.5


def test_random_delays_stay_within_bounds() -> None:
    b = Backoff(0.5, 30.0)
    expected = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    for base in expected:
        assert 0.8 * base <= b.next() <= 1.2 * base


@pytest.mark.parametrize("kwargs", [{"initial": 0.0}, {"initial": 2.0, "cap": 1.0}, {"factor": 0.5},
                                    {"jitter": 1.0}, {"jitter": -0.1}])
def test_nonsense_settings_are_refused(kwargs: dict[str, float]) -> None:
    args = {"initial": 0.5, "cap": 30.0, **kwargs}
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(args.pop("initial"), args.pop("cap"), **args)


def test_wait_or_stop_returns_when_stop_is_set() -> None:
    async def main() -> None:
        stop = asyncio.Event()
        stop.set()
        await asyncio.wait_for(wait_or_stop(stop, 3600), 5)  # would time out (and fail) if it ignored stop
    asyncio.run(main())
