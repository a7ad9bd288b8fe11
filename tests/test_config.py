"""ServeConfig: YAML plus dotted overrides, and clear errors for bad values or unknown keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnserve.config import ServeConfig
from gnnserve.errors import InvalidInputError


def test_yaml_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(
        "sampler:\n  fanouts: [10, 5]\nbatcher:\n  max_wait_ms: 2\nserver:\n  port: 9000\n"
    )
    config = ServeConfig.load(path, **{"server.port": 9100, "store.path": "s", "model_path": None})
    assert config.sampler.fanouts == [10, 5]
    assert config.batcher.max_wait_ms == 2.0
    assert config.server.port == 9100
    assert config.store.path == "s"
    assert config.model_path == ""  # None overrides are ignored


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("sampler:\n  fanouts: [0]\n", "sampler.fanouts"),
        ("batcher:\n  max_batch_nodes: -1\n", "batcher.max_batch_nodes"),
        ("server:\n  prot: 1\n", "server.prot"),
        ("admission:\n  timeout_s: soon\n", "admission.timeout_s"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInputError) as info:
        ServeConfig.load(path)
    assert info.value.field == field


def test_unreadable_yaml(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("sampler: [unclosed\n")
    with pytest.raises(InvalidInputError, match="cannot read config"):
        ServeConfig.load(tmp_path / "bad.yaml")
    with pytest.raises(InvalidInputError, match="cannot read config"):
        ServeConfig.load(tmp_path / "missing.yaml")


def test_embeddings_defaults_and_choices_match_the_registries() -> None:
    from typing import get_args

    from gnnserve.config import NewNodeMode, NewNodePolicy
    from gnnserve.newnodes.inference import MODES
    from gnnserve.newnodes.policies import POLICIES

    emb = ServeConfig.load(None).embeddings
    assert (emb.path, emb.backend, emb.mode, emb.gamma) == ("", "memory", "srpe", 0.1)
    assert (emb.policy, emb.max_new_nodes) == ("query_edges_ratio", 1024)
    assert sorted(get_args(NewNodeMode)) == sorted(MODES.names())
    assert sorted(get_args(NewNodePolicy)) == sorted(POLICIES.names())


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"embeddings.gamma": 1.5}, "embeddings.gamma"),
        ({"embeddings.mode": "exact"}, "embeddings.mode"),
        ({"embeddings.policy": "best"}, "embeddings.policy"),
        ({"embeddings.backend": "disk"}, "embeddings.backend"),
        ({"embeddings.max_new_nodes": 0}, "embeddings.max_new_nodes"),
    ],
)
def test_bad_embeddings_config_names_the_field(override: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        ServeConfig.load(None, **override)
    assert info.value.field == field
