"""The serving engine: admission, batching, the sample -> fetch -> compute pipeline."""

from gnnserve.engine.engine import Engine

__all__ = ["Engine"]
