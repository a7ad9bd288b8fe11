"""Tests of the DGS sampling / serving workers."""
