"""Tests of multi-worker deployments."""
