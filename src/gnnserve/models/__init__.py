"""Models: the GNN zoo on PyG layers, checkpoints, training and the serving-time runner."""
