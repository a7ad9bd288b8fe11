"""``gnnserve prepare``: import or generate a graph and write it as a store directory.

One sub-command per source: ``npz``, ``pyg``, ``csv``, ``sbm``, ``rmat``; common flags ``--out``,
``--dtype float32|float16``, ``--overwrite``, ``--name``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gnnserve.data import edgelist, generators, importers
from gnnserve.data.layout import StoreMeta
from gnnserve.data.writer import GraphData, write_store
from gnnserve.errors import InvalidInputError, StoreFormatError

_DELIMITERS = {"comma": ",", "tab": "\t", "whitespace": None, "semicolon": ";"}


def _common() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--out", required=True, help="store directory to write")
    parent.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        default="float32",
        help="on-disk feature dtype (default float32)",
    )
    parent.add_argument("--overwrite", action="store_true", help="replace an existing store")
    parent.add_argument("--name", default=None, help="dataset name recorded in meta.json")
    return parent


def _structure() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--structure-features",
        choices=importers.STRUCTURE_FEATURES,
        default="degree",
        help="features for graphs without any",
    )
    parent.add_argument(
        "--feature-dim", type=int, default=16, help="width of structure-only features (default 16)"
    )
    parent.add_argument("--seed", type=int, default=0, help="seed of random features")
    return parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``prepare`` sub-commands (one per source) and their flags to ``parser``."""
    sub = parser.add_subparsers(dest="prepare_source", required=True, metavar="SOURCE")
    common, structure = _common(), _structure()
    p = sub.add_parser("npz", parents=[common, structure], help="shared-datasets .npz file")
    p.add_argument("--input", required=True, help=".npz file")
    p = sub.add_parser("pyg", parents=[common, structure], help="torch.save'd PyG Data")
    p.add_argument("--input", required=True, help=".pt file holding a torch_geometric Data")
    p = sub.add_parser("csv", parents=[common], help="edge-list CSV + features .npy")
    p.add_argument("--edges", required=True, help="CSV with two integer columns src,dst")
    p.add_argument("--features", required=True, help=".npy float array [N, F]")
    p.add_argument("--labels", default=None, help=".npy integer array [N] (-1 = unknown)")
    p.add_argument("--delimiter", choices=sorted(_DELIMITERS), default="comma")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the 60/20/20 split")
    p = sub.add_parser("sbm", parents=[common], help="labelled stochastic block model")
    p.add_argument("--nodes", type=int, default=20_000)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--feature-dim", type=int, default=64)
    p.add_argument("--avg-degree", type=float, default=16.0)
    p.add_argument(
        "--in-out-ratio", type=float, default=6.0, help="p_in / p_out: higher = more homophilous"
    )
    p.add_argument("--feature-noise", type=float, default=4.0, help="feature noise std")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("rmat", parents=[common], help="R-MAT power-law graph, random features")
    p.add_argument("--nodes", type=int, default=2**20)
    p.add_argument("--edges", type=int, default=20_000_000)
    p.add_argument("--feature-dim", type=int, default=128)
    p.add_argument("--a", type=float, default=0.57)
    p.add_argument("--b", type=float, default=0.19)
    p.add_argument("--c", type=float, default=0.19)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-permute", action="store_true", help="keep R-MAT's raw node ids")


def _npz(args: argparse.Namespace) -> GraphData:
    return importers.load_npz(args.input, args.structure_features, args.feature_dim, args.seed)


def _pyg(args: argparse.Namespace) -> GraphData:
    return importers.load_pyg(args.input, args.structure_features, args.feature_dim, args.seed)


def _csv(args: argparse.Namespace) -> GraphData:
    return edgelist.load_edge_list(
        args.edges,
        args.features,
        args.labels,
        _DELIMITERS[args.delimiter],
        split_seed=args.split_seed,
    )


def _sbm(args: argparse.Namespace) -> GraphData:
    return generators.sbm(
        args.nodes,
        args.classes,
        args.feature_dim,
        args.avg_degree,
        args.in_out_ratio,
        args.feature_noise,
        args.seed,
    )


def _rmat(args: argparse.Namespace) -> GraphData:
    return generators.rmat(
        args.nodes,
        args.edges,
        args.feature_dim,
        args.a,
        args.b,
        args.c,
        args.seed,
        permute=not args.no_permute,
    )


_BUILDERS: dict[str, tuple[str, Callable[[argparse.Namespace], GraphData]]] = {
    "npz": ("importing", _npz),
    "pyg": ("importing", _pyg),
    "csv": ("importing", _csv),
    "sbm": ("generating", _sbm),
    "rmat": ("generating", _rmat),
}


def _say(msg: str) -> None:
    print(msg, flush=True)


def _summary(meta: StoreMeta, out: Path) -> None:
    classes = str(meta.num_classes) if meta.num_classes else "none (unlabelled)"
    rows = [
        ("store", str(out)),
        ("name", meta.name),
        ("nodes", f"{meta.num_nodes:,}"),
        ("edges", f"{meta.num_edges:,} directed"),
        ("features", f"{meta.feature_dim} x {meta.feature_dtype}"),
        ("classes", classes),
        ("masks", ", ".join(meta.masks) or "none"),
        ("checksum", meta.checksum),
        ("source", meta.source),
    ]
    for key, value in rows:
        _say(f"  {key:<9} {value}")


def _build_and_write(args: argparse.Namespace) -> None:
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.overwrite:
        raise InvalidInputError(f"{out} exists and is not empty (use --overwrite)", "out")
    verb, build = _BUILDERS[args.prepare_source]
    _say(f"prepare {args.prepare_source}: {verb} ...")
    t0 = time.perf_counter()
    data = build(args)
    if args.name:
        data.name = args.name
    t1 = time.perf_counter()
    _say(
        f"  {verb} done in {t1 - t0:.2f} s: {data.num_nodes:,} nodes, "
        f"{data.edge_index.shape[1]:,} edges"
    )
    _say(f"  validating and writing {out} (features {args.dtype}) ...")
    meta = write_store(data, out, feature_dtype=args.dtype, overwrite=args.overwrite)
    t2 = time.perf_counter()
    _say(f"  written in {t2 - t1:.2f} s (total {t2 - t0:.2f} s)")
    _summary(meta, out)


def run(args: argparse.Namespace) -> int:
    """Run ``gnnserve prepare``: 0 on success, 2 (message on stderr) on invalid input."""
    try:
        _build_and_write(args)
    except (InvalidInputError, StoreFormatError) as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m gnnserve.data.prepare ...``)."""
    parser = argparse.ArgumentParser(prog="gnnserve prepare", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
