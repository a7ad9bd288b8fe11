"""Open Inference Protocol v2 tensors, independent of the transport (HTTP JSON, HTTP binary, gRPC).

A request arrives as an :class:`InferCall` (its inputs decoded to numpy arrays) and leaves as an
:class:`InferAnswer`; ``server.oip_http`` and ``server.oip_grpc`` translate their wire formats to
and from these carriers, ``server.oip_infer`` runs them on the engine. Binary tensor data is the
flattened, row-major, little-endian array without padding (the protocol's binary data extension
and gRPC's ``raw_input_contents`` / ``raw_output_contents`` alike).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnnserve.errors import InvalidInputError, echo

# the protocol's fixed-size datatypes -> numpy dtypes (little-endian on the wire); BYTES (strings)
# has no use here: every input and output of a GNN model is numeric
DATATYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(code)
    for name, code in {
        "BOOL": "?",
        "UINT8": "u1",
        "UINT16": "<u2",
        "UINT32": "<u4",
        "UINT64": "<u8",
        "INT8": "i1",
        "INT16": "<i2",
        "INT32": "<i4",
        "INT64": "<i8",
        "FP16": "<f2",
        "FP32": "<f4",
        "FP64": "<f8",
    }.items()
}


@dataclass(frozen=True)
class Tensor:
    """One named tensor: ``values`` holds ``shape`` elements of ``datatype`` (flat or shaped)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    values: np.ndarray

    def as_bytes(self) -> bytes:
        """The binary data form: row-major, little-endian, in the datatype's width."""
        return np.ascontiguousarray(self.values, dtype=DATATYPES[self.datatype]).tobytes()


@dataclass
class InferCall:
    """A decoded inference request: model, inputs, the outputs asked for and their form.

    ``outputs``: names asked for (empty: the default output). ``binary``: the names to send as
    binary data, ``all_binary``: every output so (HTTP's extension; gRPC always sends raw
    contents). ``parameters``: the request
    parameters the model run reads (the transport's own, such as ``binary_data_output``, removed).
    """

    model: str
    inputs: list[Tensor]
    outputs: list[str] = field(default_factory=list)
    binary: set[str] = field(default_factory=set)
    all_binary: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    version: str | None = None


@dataclass
class InferAnswer:
    """What a model run answers: the output tensors (in the order asked) and parameters."""

    model: str
    version: str
    outputs: list[Tensor]
    parameters: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    @property
    def rows(self) -> int:
        """The nodes (or new nodes) answered: the rows of the first output."""
        first = self.outputs[0]
        return int(first.shape[0]) if first.shape else 1

    @property
    def new_nodes(self) -> bool:
        """Whether it answers new nodes (their parameters come with it)."""
        return "new_nodes" in self.parameters


def element_count(shape: tuple[int, ...] | list[int], name: str) -> int:
    """The elements of ``shape``; InvalidInputError naming ``name`` for a negative dimension."""
    if any(d < 0 for d in shape):
        raise InvalidInputError(f"{name} shape {echo(list(shape))} has a negative dimension", name)
    return math.prod(shape)


def datatype_of(name: str, datatype: str) -> np.dtype[Any]:
    """The numpy dtype of an OIP ``datatype``; InvalidInputError naming the input otherwise."""
    try:
        return DATATYPES[datatype]
    except KeyError:
        raise InvalidInputError(
            f"{name} datatype {echo(datatype)} is not one of {sorted(DATATYPES)}", name
        ) from None


def from_bytes(name: str, datatype: str, shape: list[int], raw: bytes | memoryview) -> Tensor:
    """A tensor from its binary data; InvalidInputError when the size does not match the shape."""
    dtype = datatype_of(name, datatype)
    count = element_count(shape, name)
    if len(raw) != count * dtype.itemsize:
        raise InvalidInputError(
            f"{name} holds {len(raw)} bytes of binary data; shape {echo(shape)} of {datatype} "
            f"needs {count * dtype.itemsize}",
            name,
        )
    values = np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="), copy=False)
    return Tensor(name, datatype, tuple(shape), values)


def from_values(name: str, datatype: str, shape: list[int], data: Any) -> Tensor:
    """A tensor from data sent as numbers (a list or an array, flattened row-major)."""
    dtype = datatype_of(name, datatype)
    count = element_count(shape, name)
    size = data.size if isinstance(data, np.ndarray) else len(data)
    if size != count:
        raise InvalidInputError(
            f"{name} shape {echo(shape)} does not match {size} data values", name
        )
    # integers stay exact in int64 and floats in float64 until the engine's own checks
    wide = np.float64 if dtype.kind == "f" else np.int64 if dtype.kind in "iu" else dtype
    try:
        values = np.asarray(data, dtype=wide)
    except OverflowError:
        raise InvalidInputError(f"{name} holds a value beyond the int64 range", name) from None
    return Tensor(name, datatype, tuple(shape), values.reshape(-1))
