"""Multi-worker deployments of the serving stages (Ray actors): DGS sampling/serving workers."""
