"""Fog deployment (Fograph): heterogeneous fog nodes serving full-graph GNN inference.

``profiler`` (per-node latency models and load factors), ``planner`` (IEP: METIS + bottleneck
assignment), ``scheduler`` (the dual-mode adaptive workload scheduler).
"""
