"""Fanouts (neighbours sampled per hop, nearest hop first): THE one check, and the CLI parser.

Every path that takes fanouts (server config, ``/v1/predict``, OIP parameters, new-node mode
``ns``, samplers, the pre-sampler, DGS workers, training) validates them with
:func:`check_fanouts`. A bottom-layer module: it imports nothing of gnnserve but ``errors``, so
the config can use it without pulling in the samplers (numba).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gnnserve.errors import InvalidInputError

# Largest per-hop fanout accepted anywhere (config, requests, training). Above it a fanout only
# means "every neighbour" on graphs whose degrees stay below it: ask for that with -1. The bound
# keeps per-hop arithmetic (int64 edge counts, products of fanouts) far from overflow.
MAX_FANOUT = 1_000_000


def check_fanouts(fanouts: object, *, hops: int | None = None, allow_all: bool = True) -> list[int]:
    """Validated fanouts as a list of Python ints: one per hop, each in 1..MAX_FANOUT or -1.

    ``hops``: the number of hops required (a model's layer count), or None for any number >= 1.
    ``allow_all=False`` refuses -1 ("every neighbour"), which a pre-sampled reservoir cannot
    hold. InvalidInputError naming ``fanouts`` otherwise.
    """
    if isinstance(fanouts, str | bytes) or not isinstance(fanouts, Sequence | np.ndarray):
        raise InvalidInputError("fanouts must be a list of ints, one per hop", "fanouts")
    if len(fanouts) == 0:
        raise InvalidInputError("fanouts must list at least one hop", "fanouts")
    out = []
    for f in fanouts:
        if isinstance(f, bool) or not isinstance(f, int | np.integer):
            raise InvalidInputError(f"fanouts must be ints, got {_short(f)}", "fanouts")
        if not (1 <= f <= MAX_FANOUT or (f == -1 and allow_all)):
            use = f"an int in 1..{MAX_FANOUT}" + (" or -1 (all)" if allow_all else "")
            raise InvalidInputError(f"fanout {_short(f)} invalid: use {use}", "fanouts")
        out.append(int(f))
    if hops is not None and len(out) != hops:
        raise InvalidInputError(
            f"fanouts has {len(out)} hops, the model has {hops} layers", "fanouts"
        )
    return out


def _short(value: object, limit: int = 32) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def parse_fanouts(text: str | None, flag: str = "--fanouts") -> list[int] | None:
    """Fanouts from a command-line string like ``"25,10"``; None passes through.

    Only parses; the values are checked by :func:`check_fanouts` where they are used.
    """
    if text is None:
        return None
    try:
        return [int(f) for f in text.split(",")]
    except ValueError:
        raise InvalidInputError(
            f"{flag} must be comma-separated ints, got {text!r}", "fanouts"
        ) from None
