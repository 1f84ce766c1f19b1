"""Keep Python's full garbage collections out of a running job.

A worker's heap after setup is mostly long-lived: torch, Ray, the model's modules, the
tokenizer. CPython's generation-2 collection walks all of it, holding the GIL, and in an
inference worker or the trainer that walk took 0.1–0.3 s (measured on the CPU runs of
``rollart validate``): an engine stalls mid-decode and every request in flight waits.
:func:`settle_heap` runs one collection at the end of setup and then ``gc.freeze()``s what is
left, moving it to the permanent generation that later collections skip; garbage the run
makes afterwards is still collected as usual.
"""

from __future__ import annotations

import gc


def settle_heap() -> int:
    """Collect once, then freeze the survivors; returns how many objects are now frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class SettlesHeap:
    """For the run's actors: ``settle_heap()`` is what the backend calls at the end of setup."""

    def settle_heap(self) -> int:
        return settle_heap()
