"""gnnserve: online graph neural network inference serving."""

__version__ = "0.1.0"
