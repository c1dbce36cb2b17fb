"""The hand-over thread in shared mode: the consumer takes items itself when the queue is empty.

Order must be the source's whoever takes each item, an error must reach the
consumer once, and ``close`` must end the thread, whether the consumer or the
thread is the faster one.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest

from loaders.handover import Handover


def _source(n: int, who: list[str], delay: float = 0.0, fail_at: int | None = None) -> Iterator[int]:
    for i in range(n):
        if i == fail_at:
            raise ValueError(f"item {i} is bad")
        who.append(threading.current_thread().name)
        if delay:
            time.sleep(delay)
        yield i


@pytest.mark.parametrize("depth", [1, 4])
def test_order_kept_when_the_consumer_takes_items_itself(depth: int) -> None:
    who: list[str] = []
    ahead = Handover(_source(400, who), lambda x: x * 10, depth, shared=True)
    got = list(ahead)
    assert ahead.close(timeout=2)
    assert got == [i * 10 for i in range(400)]
    assert len(who) == 400  # each item taken from the source once
    assert "MainThread" in who, "a consumer that outruns the thread takes items itself"


def test_thread_fills_the_queue_while_the_consumer_is_busy() -> None:
    who: list[str] = []
    ahead = Handover(_source(40, who), lambda x: x, 4, shared=True)
    got = []
    for item in ahead:
        got.append(item)
        time.sleep(0.01)  # a step: the thread has time to take the next items
    assert ahead.close(timeout=2)
    assert got == list(range(40))
    assert who[1:].count("cachebuild-handover") >= 35, "under a step the thread does the work"


def test_slow_source_keeps_order_and_ends() -> None:
    who: list[str] = []
    ahead = Handover(_source(30, who, delay=0.002), lambda x: x, 2, shared=True)
    assert list(ahead) == list(range(30))
    assert ahead.close(timeout=2)


@pytest.mark.parametrize("busy", [False, True])
def test_error_reaches_the_consumer_after_the_items_before_it(busy: bool) -> None:
    who: list[str] = []
    ahead = Handover(_source(50, who, fail_at=23), lambda x: x, 3, shared=True)
    got = []
    with pytest.raises(ValueError, match="item 23 is bad"):
        for item in ahead:
            got.append(item)
            if busy:
                time.sleep(0.002)
    assert got == list(range(23))
    assert ahead.close(timeout=2)


def test_close_midway_ends_the_thread() -> None:
    who: list[str] = []
    ahead = Handover(_source(10_000, who), lambda x: x, 2, shared=True)
    it = iter(ahead)
    assert [next(it) for _ in range(5)] == list(range(5))
    time.sleep(0.05)  # the thread fills the queue and waits for room
    assert ahead.close(timeout=2)
    assert len(who) < 20, "the thread stops taking items once the queue is full"


def test_with_patience_a_consumer_back_at_once_takes_every_item_itself() -> None:
    who: list[str] = []
    ahead = Handover(_source(300, who, delay=0.0002), lambda x: x, 4, shared=True, patience_s=0.005)
    assert list(ahead) == list(range(300))
    assert ahead.close(timeout=2)
    assert set(who) == {"MainThread"}, "no hand-off per item while the consumer does not step away"


def test_with_patience_a_consumer_in_longer_steps_finds_items_ready() -> None:
    who: list[str] = []
    ahead = Handover(_source(60, who, delay=0.0005), lambda x: x, 4, shared=True, patience_s=0.001)
    got = []
    for item in ahead:
        got.append(item)
        time.sleep(0.005)  # a step longer than the patience: the thread works ahead
    assert ahead.close(timeout=2)
    assert got == list(range(60))
    assert who.count("cachebuild-handover") >= 50


@pytest.mark.parametrize("patience", [0.0, 0.001])
def test_close_does_not_wait_for_the_threads_poll(patience: float) -> None:
    who: list[str] = []
    ahead = Handover(_source(10_000, who), lambda x: x, 2, shared=True, patience_s=patience)
    it = iter(ahead)
    assert [next(it) for _ in range(3)] == list(range(3))
    time.sleep(0.05)  # the thread waits: for room (queue full) or for work (the consumer is quick)
    start = time.monotonic()
    assert ahead.close(timeout=2)
    assert time.monotonic() - start < 0.05, "close woke the thread rather than waiting for its 0.1 s poll"
