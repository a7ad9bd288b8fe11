"""Stores on disk: layout and meta reader (``layout``, ``meta``: one reader of the store,
checkpoint and PE meta files), writer, input and integrity checks, importers, synthetic
generators and ``gnnserve prepare``."""
