"""Checkpoint format: exact round trip, version identity, typed errors for bad or unsafe files."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.errors import StoreFormatError
from gnnserve.graph import open_graph_store
from gnnserve.models import checkpoint
from gnnserve.models.checkpoint import CONFIG, WEIGHTS, load_checkpoint, save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.sampling import NeighborSampler
from tests.conftest import python_output
from tests.data.test_integrity import serve_processes


def _config(arch: str = "sage", hidden: int = 16) -> ModelConfig:
    return ModelConfig(arch, in_dim=16, hidden_dim=hidden, out_dim=4, num_layers=2)


def _saved(tmp_path: Path, arch: str = "sage") -> tuple[Path, GNN]:
    torch.manual_seed(3)
    model = GNN(_config(arch))
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, model, model.config, {"store_checksum": "abc", "val_acc": 0.5})
    return ckpt, model


def _rewrite_weights(ckpt: Path, obj: object) -> None:
    """Replace weights.pt and re-record its sha256, so only the content check can object."""
    torch.save(obj, ckpt / WEIGHTS)
    doc = json.loads((ckpt / CONFIG).read_text())
    doc["weights_sha256"] = hashlib.sha256((ckpt / WEIGHTS).read_bytes()).hexdigest()
    (ckpt / CONFIG).write_text(json.dumps(doc))


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat"])
def test_round_trip_gives_identical_outputs(small_store: Path, tmp_path: Path, arch: str) -> None:
    ckpt, model = _saved(tmp_path, arch)
    loaded, config, meta = load_checkpoint(ckpt)
    assert config == model.config and not loaded.training
    assert meta["store_checksum"] == "abc" and meta["val_acc"] == 0.5 and meta["date"]
    graph = open_graph_store(small_store)
    sg = NeighborSampler(graph, [4, 4]).sample(np.arange(100), rng_seed=1)
    x = torch.randn(sg.blocks[0].n_src, 16)
    deg = torch.from_numpy(graph.in_degree(sg.input_nodes).astype(np.float32))
    with torch.inference_mode():
        want = model.eval().forward_blocks(x, sg.blocks, deg)
        got = loaded.forward_blocks(x, sg.blocks, deg)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_version_is_name_and_weights_sha(tmp_path: Path) -> None:
    ckpt, model = _saved(tmp_path)
    loaded = load_checkpoint(ckpt)
    sha = hashlib.sha256((ckpt / WEIGHTS).read_bytes()).hexdigest()
    assert loaded.version == f"ckpt@{sha[:12]}"
    assert re.fullmatch(r"ckpt@[0-9a-f]{12}", loaded.version)
    named = save_checkpoint(tmp_path / "other", model, model.config, {"name": "sage-demo"})
    assert load_checkpoint(tmp_path / "other").version == named
    assert named.startswith("sage-demo@")


def test_tampered_weights_are_detected(tmp_path: Path) -> None:
    ckpt, _ = _saved(tmp_path)
    raw = bytearray((ckpt / WEIGHTS).read_bytes())
    raw[-100] ^= 0xFF
    (ckpt / WEIGHTS).write_bytes(bytes(raw))
    with pytest.raises(StoreFormatError, match="sha256"):
        load_checkpoint(ckpt)


def test_weights_not_matching_config_raise_typed_error(tmp_path: Path) -> None:
    ckpt, _ = _saved(tmp_path)
    doc = json.loads((ckpt / CONFIG).read_text())
    doc["model"]["hidden_dim"] = 32  # weights were trained with 16
    (ckpt / CONFIG).write_text(json.dumps(doc))
    with pytest.raises(StoreFormatError, match="shape") as err:
        load_checkpoint(ckpt)
    assert err.value.field == "model_path"

    state = GNN(_config()).state_dict()
    del state["convs.1.lin_l.weight"]
    state["extra"] = torch.zeros(1)
    ckpt2, _ = _saved(tmp_path / "b")
    _rewrite_weights(ckpt2, state)
    with pytest.raises(StoreFormatError, match="missing convs.1.lin_l.weight.*unexpected extra"):
        load_checkpoint(ckpt2)


def test_non_finite_weights_are_refused(tmp_path: Path) -> None:
    ckpt, model = _saved(tmp_path)
    state = model.state_dict()
    state["convs.0.lin_l.weight"][0, 0] = float("nan")
    _rewrite_weights(ckpt, state)
    with pytest.raises(StoreFormatError, match="NaN"):
        load_checkpoint(ckpt)


class _Exploit:
    """Unpickling this would run a shell command: weights_only loading must refuse it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_pickled_code_is_refused(tmp_path: Path) -> None:
    ckpt, model = _saved(tmp_path)
    marker = tmp_path / "pwned"
    _rewrite_weights(ckpt, {**model.state_dict(), "payload": _Exploit(marker)})
    with pytest.raises(StoreFormatError, match="refused"):
        load_checkpoint(ckpt)
    assert not marker.exists()


def test_not_a_dict_of_tensors_is_refused(tmp_path: Path) -> None:
    ckpt, _ = _saved(tmp_path)
    _rewrite_weights(ckpt, [torch.zeros(2)])
    with pytest.raises(StoreFormatError, match="dict of name -> tensor"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda c: (c / CONFIG).unlink(), "config.json missing"),
        (lambda c: (c / WEIGHTS).unlink(), "weights missing"),
        (lambda c: (c / CONFIG).write_text("{not json"), "unreadable"),
        (lambda c: (c / CONFIG).write_text('{"format": "other"}'), "not a gnnserve-checkpoint"),
        (lambda c: shutil.rmtree(c), "not found"),
    ],
)
def test_broken_checkpoint_directories(tmp_path: Path, damage, message: str) -> None:
    ckpt, _ = _saved(tmp_path)
    damage(ckpt)
    with pytest.raises(StoreFormatError, match=message):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"format_version": 99}, "format version 99"),
        ({"model": {"arch": "mlp"}}, "bad model config"),
        ({"meta": [1]}, "'meta' must be an object"),
    ],
)
def test_bad_config_fields(tmp_path: Path, change: dict, message: str) -> None:
    ckpt, _ = _saved(tmp_path)
    doc = json.loads((ckpt / CONFIG).read_text())
    doc.update(change)
    (ckpt / CONFIG).write_text(json.dumps(doc))
    with pytest.raises(StoreFormatError, match=message):
        load_checkpoint(ckpt)


def _edit_model_config(ckpt: Path, **changes: object) -> None:
    """Change config.json's model fields, keeping weights.pt and its recorded sha256."""
    doc = json.loads((ckpt / CONFIG).read_text())
    doc["model"].update(changes)
    (ckpt / CONFIG).write_text(json.dumps(doc))


ABSURD = [
    ({"hidden_dim": 10**9}, r"hidden_dim must be an int in \[1, 1048576\], got 1000000000"),
    ({"num_layers": 10**6}, r"num_layers must be an int in \[1, 16\], got 1000000"),
    ({"heads": 10**6}, r"heads must be an int in \[1, 64\]"),
]


@pytest.mark.timeout(120)  # the old code built 10^6 layers for ever
@pytest.mark.parametrize("change, message", ABSURD)
def test_absurd_model_config_is_refused(tmp_path: Path, change: dict, message: str) -> None:
    ckpt, _ = _saved(tmp_path)
    _edit_model_config(ckpt, **change)
    with pytest.raises(StoreFormatError, match=message) as err:
        load_checkpoint(ckpt)
    assert err.value.field == "model_path"


@pytest.mark.slow
def test_serve_exits_2_on_an_absurd_model_config(small_store: Path, tmp_path: Path) -> None:
    """Real `gnnserve serve` processes; the old code died of a traceback (hidden_dim) or hung
    building a million layers (num_layers)."""
    runs = {}
    for name, change in (("hidden", ABSURD[0][0]), ("layers", ABSURD[1][0])):
        ckpt, _ = _saved(tmp_path / name)
        _edit_model_config(ckpt, **change)
        runs[name] = (small_store, ckpt)
    results = serve_processes(runs)
    for (name, (code, err)), (_, message) in zip(results.items(), ABSURD, strict=False):
        assert code == 2, (name, code, err[-2000:])
        assert re.search(r"^error: .*config\.json: bad model config: " + message, err, re.M), err
        assert "Traceback" not in err


@pytest.mark.parametrize("hidden, message", [(1 << 16, "can hold"), (8, "does not match")])
def test_config_not_matching_the_weights_is_refused_before_building_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hidden: int, message: str
) -> None:
    """More parameters than weights.pt has bytes: refused by size; fewer: by shape (on the meta
    device). Either way the model itself is never built (GNN would allocate 2^16-wide layers)."""
    ckpt, _ = _saved(tmp_path)  # hidden_dim 16
    _edit_model_config(ckpt, hidden_dim=hidden)
    need = ModelConfig("sage", 16, hidden, 4).num_parameters()
    assert (need > (ckpt / WEIGHTS).stat().st_size) == (message == "can hold")

    def built(*args: object) -> None:
        raise AssertionError("the model was built")

    monkeypatch.setattr(checkpoint, "GNN", built)
    with pytest.raises(StoreFormatError, match=message):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat"])
def test_state_shapes_match_state_dict(arch: str) -> None:
    model = GNN(_config(arch))
    model.register_buffer("kept", torch.zeros(3, 2))
    model.register_buffer("dropped", torch.zeros(5), persistent=False)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert checkpoint.state_shapes(model) == want and "kept" in want


def test_loading_a_checkpoint_imports_neither_onnx_nor_dynamo(tmp_path: Path) -> None:
    """Start-up cost: state_dict() on a PyG Linear imports torch.onnx and torch._dynamo (~2 s)."""
    ckpt, _ = _saved(tmp_path)
    code = (
        "import sys\n"
        "from gnnserve.models.checkpoint import load_checkpoint\n"
        f"load_checkpoint({str(ckpt)!r})\n"
        "loaded = [m for m in ('torch.onnx', 'torch._dynamo.convert_frame') if m in sys.modules]\n"
        "print(','.join(loaded) or 'none')\n"
    )
    assert python_output(code) == ["none"]
