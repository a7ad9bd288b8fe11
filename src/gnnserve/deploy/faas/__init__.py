"""Serverless deployment (FaaS-GNN, seed 000): function instances that start on demand and scale
to zero, read only the part of the graph a request needs from an object store (on-demand
fetching), keep an adaptive feature cache sized by a memory predictor, and are driven by the
load-aware scheduler."""
