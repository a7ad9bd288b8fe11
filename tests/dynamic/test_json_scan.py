"""Edge update bodies scanned from their bytes against ``json.loads`` + ``columns.from_json`` as
the reference: the same columns for every plain edge body, None for anything else."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnnserve.dynamic import columns
from gnnserve.dynamic.json_scan import scan_edges

DIM = 4


def _body(ops: list[dict], rng: np.random.Generator) -> bytes:
    """``{"ops": ops}`` as a client may write it: keys in any order, any JSON whitespace."""
    spaces = [" ", "", "\n", "\t", "  ", "\r\n"]

    def ws() -> str:
        return str(rng.choice(spaces))

    parts = []
    for op in ops:
        keys = list(op)
        rng.shuffle(keys)
        fields = [f'{ws()}"{k}"{ws()}:{ws()}{json.dumps(op[k])}{ws()}' for k in keys]
        parts.append(ws() + "{" + ",".join(fields) + "}" + ws())
    return f'{ws()}{{{ws()}"ops"{ws()}:{ws()}[{",".join(parts)}]{ws()}}}{ws()}'.encode()


def test_plain_edge_bodies_scan_to_the_columns_json_gives() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(1, 40))
        ops = [
            {
                "op": str(rng.choice(["add_edge", "delete_edge"])),
                "src": int(rng.integers(-5, 10 ** int(rng.integers(1, 18)))),
                "dst": int(rng.integers(0, 10**6)),
            }
            for _ in range(k)
        ]
        body = _body(ops, rng)
        want = columns.from_json(json.loads(body)["ops"], DIM)
        got = scan_edges(body, DIM)
        assert want is not None and got is not None, body[:200]
        for name in ("op", "src", "dst", "node", "features"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all(), name


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'{"ops": []}',
        b'{"ops": [{"op": "add_edge", "src": 1, "dst": 2}]',  # unclosed
        b'{"ops": [{"op": "add_edge", "src": 1, "dst": 2}],}',
        b'{"ops": [{"op": "add_edge", "src": 1, "dst": 2}]} x',
        b'{"ops": [{"op": "add_edge", "src": 1, "dst": 2}], "more": 1}',
        b'{"ops": [{"op": "add_edge", "src": 1}]}',  # no dst
        b'{"ops": [{"op": "add_edge", "src": 1, "dst": 2, "dst": 3}]}',  # a key twice
        b'{"ops": [{"op": "add_edge", "src": 1, "dst": 2, "w": 3}]}',  # another key
        b'{"ops": [{"op": "add_node", "features": [1, 2, 3, 4]}]}',
        b'{"ops": [{"op": "add_edge", "src": 1.0, "dst": 2}]}',
        b'{"ops": [{"op": "add_edge", "src": 1e3, "dst": 2}]}',
        b'{"ops": [{"op": "add_edge", "src": 01, "dst": 2}]}',
        b'{"ops": [{"op": "add_edge", "src": -, "dst": 2}]}',
        b'{"ops": [{"op": "add_edge", "src": 1234567890123456789, "dst": 2}]}',  # 19 digits
        b'{"ops": [{"op": "add_edge", "src": true, "dst": 2}]}',
        b'{"ops": [{"op": "add_edge", "src": "1", "dst": 2}]}',
        b'{"ops": [{"op": "add_\\u0065dge", "src": 1, "dst": 2}]}',  # an escape
        b'{"ops": [{"op": "add_edges", "src": 1, "dst": 2}]}',
        b'{"ops": [{"op": "add_edge", "src": 1, "dst": 2},]}',
        b'{"ops": [{"op": "add_edge", "src": 1, "dst": 2} {"op": "add_edge", "src": 1, "dst": 2}]}',
    ],
)
def test_anything_else_is_left_to_the_json_parser(body: bytes) -> None:
    assert scan_edges(body, DIM) is None
