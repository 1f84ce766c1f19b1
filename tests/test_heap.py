import gc
import weakref

from rollart.runtime.heap import settle_heap


class _Node:
    def __init__(self) -> None:
        self.other: "_Node | None" = None


def test_settle_heap_freezes_the_setup_heap_and_still_collects_later_garbage():
    try:
        frozen = settle_heap()
        assert frozen > 0 and gc.get_freeze_count() == frozen
        a, b = _Node(), _Node()
        a.other, b.other = b, a          # a cycle only the collector can free
        dead = weakref.ref(a)
        del a, b
        gc.collect()
        assert dead() is None
    finally:
        gc.unfreeze()
