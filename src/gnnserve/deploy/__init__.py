"""Deployment modes: executors that run the serving stages on Ray actors.

``ray.py`` starts Ray (one place for every mode); ``dgs/`` holds the DGS sampling and serving
workers and :class:`~gnnserve.deploy.dgs.executor.DGSExecutor` (``--deploy dgs``); ``cgp/`` the
CGP workers and :class:`~gnnserve.deploy.cgp.executor.CGPExecutor` (``--deploy cgp``). Each
executor is registered by import path in :data:`gnnserve.engine.executor.EXECUTORS`.
"""
