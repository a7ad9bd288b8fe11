"""Precomputed layer embeddings (PEs) and selective recomputation for new-node queries (OMEGA)."""
