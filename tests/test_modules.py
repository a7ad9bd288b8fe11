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


def test_faas_instances_and_launchers_do_not_import_each_other() -> None:
    """A cycle found by a review (instance -> launch -> instance, function-level imports
    counted): the two share ``faas.resources`` instead."""
    import grimp

    graph = grimp.build_graph("gnnserve")
    instance, launch = "gnnserve.deploy.faas.instance", "gnnserve.deploy.faas.launch"
    assert graph.chain_exists(importer=launch, imported=instance)  # launch starts instances
    assert not graph.chain_exists(importer=instance, imported=launch)
