"""The heap at the start of training (worker/trainer.py settle_heap), in process."""

from __future__ import annotations

import gc
import weakref

from musubi.worker.trainer import settle_heap


class _Node:
    """An object that refers to itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_training_starts_with_set_up_collected_the_rest_frozen_and_the_collector_on() -> None:
    # A rank's start-up runs with the collector off (worker.main); training must not.
    was_on = gc.isenabled()
    gc.disable()
    try:
        garbage = _Node()
        gone = weakref.ref(garbage)
        del garbage
        assert gone() is not None  # off: the cycle outlives its last name
        settle_heap()
        assert gone() is None
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        (gc.enable if was_on else gc.disable)()
