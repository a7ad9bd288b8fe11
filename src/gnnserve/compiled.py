"""What numba has compiled in this process: the counter behind "ready means warm".

A numba dispatcher compiles (or loads from the on-disk cache) one signature per combination of
argument types on its first call with them. Comparing :func:`compiled_signatures` before and
after a request tells whether that request paid for a compilation; the warm-up tests do this in
the server process and in every Ray worker that runs a kernel.
"""

from __future__ import annotations

import sys

from numba.core.dispatcher import Dispatcher


def compiled_signatures() -> dict[str, list[str]]:
    """``module.kernel`` -> the signatures it holds, for every numba kernel gnnserve loaded."""
    out: dict[str, list[str]] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("gnnserve.") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, Dispatcher):
                out[f"{name}.{attr}"] = sorted(str(s) for s in value.signatures)
    return out
