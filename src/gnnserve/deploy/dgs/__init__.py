"""DGS (seed 004, Figure 1): sampling workers keep one-hop reservoirs of their key range of the
update stream and push changed reservoirs to the serving workers that subscribe to them; a
serving worker answers a k-hop request from its local cache only. See ``service.DGSService``.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gnnserve.deploy.dgs.service import DGSService


def __getattr__(name: str) -> Any:
    # Lazy: each worker process imports its module through this package, and must not import
    # the driver's service (torch with it, ~2 s of start-up per worker).
    if name == "DGSService":
        from gnnserve.deploy.dgs.service import DGSService

        return DGSService
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DGSService"]
