"""The serving engine: admission -> batcher -> executor (engine/executor.py: the Executor ABC and
the EXECUTORS registry; engine/local.py: the in-process sample -> fetch -> compute pipeline)."""

from gnnserve.engine.engine import Engine

__all__ = ["Engine"]
