"""torch._dynamo deferred to its first use, with torch_geometric and torch.compile unchanged."""

from __future__ import annotations

from tests.conftest import python_output

SCRIPT = """
import sys, torch
import gnnserve.models.arch  # defers torch._dynamo, then PyG may be imported
import torch_geometric.nn
from gnnserve.deferred_imports import is_deferred
print("deferred after PyG:", is_deferred(), "torch._dynamo.convert_frame" in sys.modules)
lin = torch.nn.Linear(3, 2)
x = torch.randn(4, 3)
compiled = torch.compile(lin, backend="eager")
print("equal:", torch.equal(compiled(x), lin(x)))
real = sys.modules["torch._dynamo"]
print("real:", not is_deferred(), torch._dynamo is real, hasattr(real, "__path__"))
from torch_geometric import is_torch_instance
from torch._dynamo import eval_frame
print("isinstance:", is_torch_instance(compiled, torch.nn.Linear), eval_frame.__name__)
"""


def test_torch_dynamo_loads_on_first_use_only() -> None:
    assert python_output(SCRIPT, timeout=300) == [
        "deferred after PyG: True False",
        "equal: True",
        "real: True True True",
        "isinstance: True torch._dynamo.eval_frame",
    ]


def test_nothing_is_deferred_once_dynamo_is_imported() -> None:
    code = (
        "import torch._dynamo, sys\n"
        "from gnnserve.deferred_imports import defer_torch_dynamo, is_deferred\n"
        "defer_torch_dynamo(); print(is_deferred(), type(sys.modules['torch._dynamo']).__name__)"
    )
    assert python_output(code) == ["False module"]


def test_introspection_does_not_load_the_deferred_module() -> None:
    """``inspect.getmodule`` (torch.library calls it while torch.distributed imports) probes
    ``__file__`` of every module: that probe must not import torch._dynamo half-way through
    another import (a circular import when tests ran in some orders)."""
    code = (
        "import inspect, sys\n"
        "import gnnserve.models.arch\n"
        "from gnnserve.deferred_imports import is_deferred\n"
        "inspect.getmodule(inspect.currentframe())\n"
        "print(is_deferred(), hasattr(sys.modules['torch._dynamo'], '__file__'))\n"
        "import torch.distributed.tensor\n"
        "print('imported')"
    )
    assert python_output(code, timeout=300) == ["True False", "imported"]
