"""The operator's collector settings: start-up objects frozen out of every scan, young generations
large enough that in-flight work dies young, cycles still collected without a manual call, and the
collector's pauses exposed as metrics.

Run in a child interpreter: the settings are process-wide and must not change the test runner's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import gc, weakref
    from posttrain_operator.runtime import GC_THRESHOLDS, settle_garbage_collector

    started_with = len(gc.get_objects())
    settle_garbage_collector()
    assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold()
    assert gc.get_freeze_count() >= started_with // 2, (gc.get_freeze_count(), started_with)
    assert len(gc.get_objects()) < started_with // 10, len(gc.get_objects())

    class Node:
        pass

    cycle = Node()
    cycle.self = cycle
    alive = weakref.ref(cycle)
    del cycle
    keep = [[] for _ in range(GC_THRESHOLDS[0] * 3)]  # tracked allocations: young collections run
    assert alive() is None, "a young cycle outlived its generation's threshold"

    from posttrain_operator.metrics import COLLECTOR_PAUSES, OperatorMetrics

    settle_garbage_collector()  # again: still one hook
    assert gc.callbacks.count(COLLECTOR_PAUSES._record) == 1
    before = COLLECTOR_PAUSES.collections[2]
    gc.collect()
    assert COLLECTOR_PAUSES.collections[2] == before + 1
    assert COLLECTOR_PAUSES.seconds[2] >= COLLECTOR_PAUSES.longest[2] > 0
    exposed = OperatorMetrics().exposition().decode()
    assert f'posttrain_gc_collections_total{{generation="2"}} {before + 1}.0' in exposed, exposed
    assert 'posttrain_gc_longest_pause_seconds{generation="0"}' in exposed
    print("ok")
    """
)


def test_start_up_objects_are_frozen_young_cycles_are_still_collected_and_pauses_are_counted() -> None:
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
