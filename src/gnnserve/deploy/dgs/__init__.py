"""DGS (seed 004, Figure 1): sampling workers keep one-hop reservoirs of their key range of the
update stream and push changed reservoirs to the serving workers that subscribe to them; a
serving worker answers a k-hop request from its local cache only. See ``service.DGSService``.
"""

from gnnserve.deploy.dgs.service import DGSService

__all__ = ["DGSService"]
