"""Models: the GNN stack (``zoo``) over the architectures of ``models.arch`` (one module and one
MODELS entry each), checkpoints, training and the serving-time runner."""
