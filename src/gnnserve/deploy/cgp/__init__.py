"""CGP (OMEGA §6, computation graph parallelism): new-node SRPE inference spread over P workers
that each build and run the part of the computation graph whose sources they own, exchanging
per-layer partial aggregations (all-to-all) merged by custom merge functions. See
``service.CGPService``; it answers with a ``newnodes.result.NewNodeResult`` whose ``traffic``
counts the bytes exchanged.
"""

from gnnserve.deploy.cgp.service import CGPService

__all__ = ["CGPService"]
