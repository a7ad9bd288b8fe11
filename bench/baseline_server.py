"""The baseline a PyG user would write: FastAPI + a NeighborLoader per request + the same model.

One concession to the baseline: the NeighborSampler (its CSC conversion of the graph) is built
once at start-up and handed to each request's NeighborLoader, as PyG's docs allow; building it
per request would make the baseline far slower still.

    python bench/baseline_server.py --store DIR --model CKPT --port 8100 [--torch-threads N]
        [--sampler pyg-lib|torch-sparse]

``--torch-threads`` sets torch's intra-op threads (default: torch's own, one per core);
``--sampler`` PyG's neighbour sampler: pyg-lib (default, what PyG users get) or its deprecated
torch-sparse fallback. ``GET /health`` reports both in force.
"""

from __future__ import annotations

import argparse
import socket

import numpy as np
import torch
import torch_geometric.typing as pyg_typing
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader
from torch_geometric.sampler import NeighborSampler

from gnnserve.data import layout
from gnnserve.models.checkpoint import load_checkpoint


class Body(BaseModel):
    nodes: list[int]


def build_app(store: str, model_dir: str, fanouts: list[int]) -> FastAPI:
    """Load the store into a PyG ``Data`` and serve ``/predict``."""
    meta = layout.read_meta(store)
    indptr = np.fromfile(f"{store}/{layout.INDPTR}", dtype="<i8")
    indices = np.fromfile(f"{store}/{layout.INDICES}", dtype=meta.indices_dtype).astype(np.int64)
    dst = np.repeat(np.arange(meta.num_nodes), np.diff(indptr))
    x = np.fromfile(f"{store}/{layout.FEATURES}", dtype=meta.feature_dtype)
    data = Data(
        x=torch.from_numpy(x.reshape(meta.num_nodes, meta.feature_dim).astype(np.float32)),
        edge_index=torch.from_numpy(np.stack([indices, dst])),
        num_nodes=meta.num_nodes,
    )
    model = load_checkpoint(model_dir).model.eval()
    sampler = NeighborSampler(data, num_neighbors=fanouts)
    app = FastAPI()

    @app.post("/predict")
    def predict(body: Body) -> dict[str, list[int]]:
        loader = NeighborLoader(
            data,
            num_neighbors=fanouts,
            input_nodes=torch.tensor(body.nodes),
            batch_size=len(body.nodes),
            neighbor_sampler=sampler,
        )
        batch = next(iter(loader))
        with torch.no_grad():
            out = model(batch.x, batch.edge_index)[: batch.batch_size]
        return {"predictions": out.argmax(dim=1).tolist()}

    @app.get("/health")
    def health() -> dict[str, object]:
        sampler_name = "pyg-lib" if pyg_typing.WITH_PYG_LIB else "torch-sparse"
        return {"ok": True, "torch_threads": torch.get_num_threads(), "sampler": sampler_name}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--fanouts", default="25,10")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--sampler", choices=("pyg-lib", "torch-sparse"), default="pyg-lib")
    parser.add_argument(
        "--reuse-port", action="store_true", help="share the port with other such processes"
    )
    args = parser.parse_args()
    if args.sampler == "pyg-lib" and not pyg_typing.WITH_PYG_LIB:
        parser.error("pyg-lib is not installed: pip install ../shared/wheels/*.whl")
    pyg_typing.WITH_PYG_LIB = args.sampler == "pyg-lib"  # PyG reads it per sampling call
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    app = build_app(args.store, args.model, [int(f) for f in args.fanouts.split(",")])
    if not args.reuse_port:
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
        return
    # several of these processes on one port: the kernel spreads connections over them
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", args.port))
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
