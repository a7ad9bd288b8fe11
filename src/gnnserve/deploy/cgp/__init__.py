"""CGP (OMEGA §6, computation graph parallelism): new-node SRPE inference spread over P workers
that each build and run the part of the computation graph whose sources they own, exchanging
per-layer partial aggregations (all-to-all) merged by custom merge functions. See
``service.CGPService``.
"""

from gnnserve.deploy.cgp.service import CGPResult, CGPService

__all__ = ["CGPResult", "CGPService"]
