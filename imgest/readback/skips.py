"""The ``skipped`` lines of the readers a read-back check does not run: what its budget could not buy them."""

from __future__ import annotations

from imgest.readback.budget import LEAST_SHARE, CheckClock


def not_kept(reader: str, mode: str, clock: CheckClock | None, reserve: float) -> str:
    """The ``skipped`` line of a reader whose reserve the check's budget could not keep (CheckClock.affords)."""
    seconds = clock.seconds if clock is not None else 0.0
    return (
        f"{reader} ({mode}): not run: the check's {seconds:.1f} s budget cannot keep the {reserve:.1f} s a turn of it "
        f"needs (start-up, warm-up and window, teardown) beside {LEAST_SHARE:.1f} s for each reader before it (a "
        "larger check_seconds, or from 100,000 images a longer run, buys it a measurement)"
    )


def not_run(reader: str, mode: str, clock: CheckClock | None) -> str:
    """The ``skipped`` line of a reader spent_before its turn."""
    seconds = clock.seconds if clock is not None else 0.0
    return (
        f"{reader} ({mode}): not run: the check's {seconds:.1f} s budget was spent before its turn, or what was "
        "left would not cover its start-up and the window its rate needs (a larger check_seconds, or from 100,000 "
        "images a longer run, buys it a measurement)"
    )
