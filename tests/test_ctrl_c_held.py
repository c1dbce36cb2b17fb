"""``ctrl_c_held``: a Ctrl-C during a step that an interrupt would leave half done (a local Ray's start, a Ray
task's submission) is noted and raised by the caller after the step, not in its middle; a program's own SIGINT
handler, and other threads, are left alone; the first Ctrl-C is said (what is awaited), a second one leaves at once."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest

from cachebuild.builder.stop import ctrl_c_held


def test_a_ctrl_c_in_the_block_is_noted_not_raised() -> None:
    reached = False
    with ctrl_c_held() as came:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # (Python runs signal handlers between bytecodes: several chances to raise)
            pass
        reached = True
    assert reached and came == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C after the block: Python's own, as before
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass


def test_the_first_ctrl_c_is_said_and_a_second_one_leaves_at_once(caplog: pytest.LogCaptureFixture) -> None:
    reached = False
    with caplog.at_level(logging.WARNING, logger="cachebuild"), pytest.raises(KeyboardInterrupt), ctrl_c_held(say="stopping: soon") as came:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
        assert came == [signal.SIGINT] and caplog.messages == ["stopping: soon"]
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
        reached = True
    assert not reached and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nothing_noted_without_a_ctrl_c_and_an_error_leaves_the_handler_restored() -> None:
    with pytest.raises(ValueError), ctrl_c_held() as came:
        raise ValueError("x")
    assert came == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_programs_own_handler_is_left_alone() -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        with ctrl_c_held() as came:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        assert got == [signal.SIGINT] and came == []
    finally:
        signal.signal(signal.SIGINT, previous)


def test_off_the_main_thread_or_not_asked_the_block_runs_as_it_is() -> None:
    seen: list[object] = []

    def run() -> None:
        with ctrl_c_held() as came:
            seen.append(signal.getsignal(signal.SIGINT))
        seen.append(came)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    with ctrl_c_held(hold=False):
        seen.append(signal.getsignal(signal.SIGINT))
    assert seen == [signal.default_int_handler, [], signal.default_int_handler]
