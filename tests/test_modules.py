"""Every module of gnnserve imports on a machine without a GPU or a running service: the floor
under `make test-fast`, whose tests exercise all but the deployment executors and the S3 store
(those run in the `slow`/`distributed` tests of `make test`)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gnnserve


def _modules() -> list[str]:
    found = pkgutil.walk_packages(gnnserve.__path__, prefix="gnnserve.")
    return sorted(info.name for info in found)


def test_the_walk_finds_the_package_tree() -> None:
    names = _modules()
    assert len(names) > 150  # the package, not a stray directory
    assert {"gnnserve.cli", "gnnserve.deploy.faas.instance", "gnnserve.data.s3"} <= set(names)


@pytest.mark.parametrize("name", _modules())
def test_module_imports(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__name__ == name and module.__doc__, f"{name} has no docstring"
