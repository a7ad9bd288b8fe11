"""Precomputed layer embeddings (PEs): their stores and their precomputation (layer-wise
full-graph inference). New-node inference that reads them lives in :mod:`gnnserve.newnodes`."""
