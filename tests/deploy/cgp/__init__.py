"""Tests of computation graph parallelism (OMEGA §6): partial aggregations and the CGP service."""
