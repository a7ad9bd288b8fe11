"""The warm-up compiles every kernel of the update path, so no real update waits on numba JIT."""

from __future__ import annotations

from gnnserve.graph import dynamic
from gnnserve.graph.warmup import warm_up_updates
from gnnserve.sampling import presample_kernels as pk


def test_warm_up_compiles_update_and_presample_kernels() -> None:
    warm_up_updates([3, 2])
    kernels = [dynamic._apply_events, dynamic._compact, pk.build, pk.step_events, pk.assemble]
    for kernel in kernels:
        assert kernel.signatures, f"{kernel.__name__} was not compiled by the warm-up"
    assert warm_up_updates([3, 2]) == 0.0  # once per process and query
