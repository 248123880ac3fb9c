"""``WaitLines``: a change wakes the first waiter of each line, not every waiter; a woken
call hands the wake on to the next one of its line; nothing is left waiting or held."""

from __future__ import annotations

import asyncio

from raybus._core.wait_lines import WaitLines


async def _settle() -> None:
    """Let every task that can run, run."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _start(lines: WaitLines, line: object, n: int, timeout: float = 5.0) -> list:
    tasks = [asyncio.ensure_future(lines.wait(line, timeout)) for _ in range(n)]
    await _settle()
    return tasks


async def test_a_change_wakes_the_first_waiter_of_a_line_only() -> None:
    lines = WaitLines()
    tasks = await _start(lines, "main", 8)
    lines.notify()
    await _settle()
    assert [t.done() for t in tasks] == [True] + [False] * 7
    assert tasks[0].result() is True
    assert lines.waiting("main") == 7 and lines.wakes == 1
    lines.notify_all()
    assert await asyncio.gather(*tasks[1:]) == [True] * 7


async def test_pass_on_wakes_the_next_in_the_order_they_came() -> None:
    lines = WaitLines()
    tasks = await _start(lines, "main", 3)
    lines.notify()
    lines.pass_on("main")
    await _settle()
    assert [t.done() for t in tasks] == [True, True, False]
    lines.pass_on("main")
    lines.pass_on("main")  # nobody left: nothing happens
    await _settle()
    assert all(t.done() for t in tasks)
    assert lines.wakes == 3 and lines.waiting() == 0


async def test_a_change_wakes_the_first_of_every_line() -> None:
    lines = WaitLines()
    main = await _start(lines, "main", 2)
    dead = await _start(lines, "dead", 2)
    lines.notify()
    await _settle()
    assert [t.done() for t in main + dead] == [True, False, True, False]
    lines.notify_all()
    await asyncio.gather(*main, *dead)


async def test_a_timeout_answers_false_and_leaves_no_waiter_behind() -> None:
    lines = WaitLines()
    assert await lines.wait("main", 0.01) is False
    assert lines.waiting() == 0 and not lines._lines
    lines.notify()  # nobody to wake
    assert lines.wakes == 0


async def test_a_woken_call_cancelled_before_it_looked_passes_the_wake_on() -> None:
    lines = WaitLines()
    first, second = await _start(lines, "main", 2)
    lines.notify()  # wakes the first ...
    first.cancel()  # ... which is cancelled before it runs
    await _settle()
    assert first.cancelled()
    assert second.done() and second.result() is True  # the wake was not lost


async def test_a_call_cancelled_while_waiting_takes_no_wake() -> None:
    lines = WaitLines()
    first, second, third = await _start(lines, "main", 3)
    first.cancel()
    await _settle()
    assert lines.waiting("main") == 2
    lines.notify()
    await _settle()
    assert second.done() and not third.done()
    lines.notify_all()
    await third


async def test_notify_all_wakes_everyone_and_later_waiters_wait_again() -> None:
    lines = WaitLines()
    tasks = await _start(lines, "main", 4) + await _start(lines, "other", 2)
    lines.notify_all()
    assert await asyncio.gather(*tasks) == [True] * 6
    later = await _start(lines, "main", 1)
    assert not later[0].done() and lines.waiting("main") == 1
    lines.notify()
    assert await later[0] is True
    assert not lines._lines  # empty lines are dropped
