"""A software prefetch for numba kernels: ``prefetch(array, i)`` asks the CPU to start loading
``array[i]`` into cache now, so that a later read finds it there.

The samplers and the feature gather walk node ids in an order the hardware prefetcher cannot
guess (row metadata, neighbour lists and feature rows of random nodes): each access is a cache
miss, and a loop body long enough to hold a few of them keeps the out-of-order core from
overlapping the next ones. Issuing the load a few iterations ahead overlaps them (bench/sampling.py
measures what it buys). It is LLVM's ``llvm.prefetch`` (read, high locality, data cache): a hint
that never faults, so an index past the array's end is harmless (it is not bounds-checked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_READ, _LOCALITY, _DATA = 0, 3, 1  # llvm.prefetch: read access, keep in all levels, data cache


@intrinsic
def _prefetch(typingctx: Any, array: Any, index: Any) -> Any:
    """``prefetch(array, i)`` in an njit function: hint a load of ``array[i]`` (1-D array,
    integer index; nothing is read, nothing can fault)."""
    if not isinstance(array, types.Array) or array.ndim != 1:
        return None
    if not isinstance(index, types.Integer):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty, idxty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = context.cast(builder, args[1], idxty, types.intp)
        ptr = cgutils.get_item_pointer(
            context, builder, aryty, ary, [idx], wraparound=False, boundscheck=False
        )
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        flags = [ir.Constant(i32, v) for v in (_READ, _LOCALITY, _DATA)]
        builder.call(fn, [builder.bitcast(ptr, i8p), *flags])
        return context.get_dummy_value()

    return types.void(array, index), codegen


prefetch = cast(Callable[[Any, int], None], _prefetch)  # how njit code calls it
