"""numba-cuda's device allocations through torch's caching allocator (numba's EMM plug-in).

By default every ``cuda.device_array`` of the sampler is a ``cuMemAlloc`` and its release a
deferred ``cuMemFree``: a 2-hop sample allocates about fifteen arrays, each a driver call that
can cost tens of microseconds and synchronise the device. With :func:`use_torch_allocator`
numba asks torch's caching allocator instead, which hands back a cached block of the same
size class in a few microseconds, and both libraries share one pool of GPU memory (what torch
reports in ``torch.cuda.memory_allocated`` includes the sampler's arrays).

The plug-in must be installed before numba creates its CUDA context (the first kernel launch
or device array of the process); :func:`use_torch_allocator` says whether it could.
``GNNSERVE_CUDA_ALLOCATOR=numba`` keeps numba's own allocator.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

import torch
from numba import cuda

from gnnserve.sampling import cuda_kernels as kern

ALLOCATOR_ENV = "GNNSERVE_CUDA_ALLOCATOR"  # torch (default) | numba
_manager: type | None = None  # the plug-in class, once installed


def _device_pointer(address: int) -> Any:
    """``address`` in the pointer type numba's driver binding takes."""
    try:
        from cuda.bindings.driver import CUdeviceptr  # numba-cuda with NVIDIA's binding

        return CUdeviceptr(address)
    except ImportError:  # numba's ctypes binding
        return ctypes.c_uint64(address)


def _release(address: int, allocations: dict[int, int]) -> Callable[[], None]:
    def release() -> None:
        # numba's context reset may have emptied ``allocations`` (and freed nothing of ours)
        # before a late finalizer runs; the block still goes back to torch's cache.
        allocations.pop(address, None)
        torch.cuda.caching_allocator_delete(address)

    return release


def _manager_class() -> type:
    from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer
    from numba.cuda.cudadrv.driver import GetIpcHandleMixin, MemoryInfo

    class TorchMemoryManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):  # type: ignore[misc]
        """numba's device memory from torch's caching allocator (device arrays only; pinned
        and mapped host memory stay numba's own)."""

        def initialize(self) -> None:
            torch.cuda.init()

        def memalloc(self, size: int) -> Any:
            address = torch.cuda.caching_allocator_alloc(max(int(size), 1))
            self.allocations[address] = size
            release = _release(address, self.allocations)
            return MemoryPointer(self.context, _device_pointer(address), size, finalizer=release)

        def get_memory_info(self) -> Any:
            free, total = torch.cuda.mem_get_info()
            return MemoryInfo(free=free, total=total)

        def reset(self) -> None:
            super().reset()
            torch.cuda.empty_cache()

        @property
        def interface_version(self) -> int:
            return 1

    return TorchMemoryManager


def use_torch_allocator() -> bool:
    """Route numba-cuda's device allocations through torch's caching allocator; True when
    numba's CUDA context uses it. False without a GPU, and when numba's context already existed
    (a context keeps the manager it was made with: numba's own, correct and only slower)."""
    global _manager
    if kern.SIMULATED or not torch.cuda.is_available():
        return False
    if os.environ.get(ALLOCATOR_ENV, "torch") == "numba":
        return False
    if _manager is None:
        _manager = _manager_class()
        cuda.set_memory_manager(_manager)
    return isinstance(cuda.current_context().memory_manager, _manager)
