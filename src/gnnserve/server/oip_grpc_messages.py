"""The Open Inference Protocol's gRPC messages, and requests and answers to and from them.

The message classes are built at run time from the checked-in descriptor set of
``proto/grpc_predict_v2.proto`` (``make proto`` after a change), in a descriptor pool of their
own: tritonclient's generated ``inference.*`` messages hold the same names, and protobuf's
default pool refuses a second file defining them in a process that imports both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from gnnserve.errors import InvalidInputError, echo
from gnnserve.server.oip_tensors import (
    DATATYPES,
    InferAnswer,
    InferCall,
    Tensor,
    from_bytes,
    from_values,
)

DESCRIPTORS = Path(__file__).with_name("proto") / "grpc_predict_v2.binpb"
# typed contents field of each datatype (raw contents need none)
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def _message_classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes()).file:
        pool.Add(file)
    names = [
        f"{kind}{part}"
        for kind in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata")
        + ("ModelMetadata", "ModelInfer")
        for part in ("Request", "Response")
    ]
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inference.{n}"))
        for n in names
    }


MESSAGES = _message_classes()


def _parameter(value: Any) -> Any:
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def _parameters(params: Any) -> dict[str, Any]:
    out = {key: _parameter(value) for key, value in params.items()}
    fanouts = out.get("fanouts")
    if isinstance(fanouts, str):  # "10,5": a gRPC parameter holds no list
        try:
            out["fanouts"] = [int(part) for part in fanouts.split(",")]
        except ValueError:
            raise InvalidInputError(
                f"fanouts must be comma-separated ints such as '10,5', got {echo(fanouts)}",
                "fanouts",
            ) from None
    return out


def to_call(request: Any) -> InferCall:
    """The :class:`InferCall` of a ``ModelInferRequest`` (raw or typed input contents)."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidInputError(
            f"raw_input_contents holds {len(raw)} entries for {len(request.inputs)} inputs",
            "raw_input_contents",
        )
    inputs: list[Tensor] = []
    for i, t in enumerate(request.inputs):
        shape = list(t.shape)
        if raw:
            inputs.append(from_bytes(t.name, t.datatype, shape, raw[i]))
            continue
        field = _CONTENTS.get(t.datatype)
        if field is None:
            raise InvalidInputError(
                f"{echo(t.name)} datatype {echo(t.datatype)} is not one of {sorted(DATATYPES)}"
                " (FP16 is sent as raw contents only)",
                t.name,
            )
        values = np.asarray(getattr(t.contents, field))
        inputs.append(from_values(t.name, t.datatype, shape, values))
    outputs = [o.name for o in request.outputs]
    return InferCall(
        model=request.model_name,
        inputs=inputs,
        outputs=outputs,
        parameters=_parameters(request.parameters),
        id=request.id or None,
        version=request.model_version or None,
    )


def to_response(answer: InferAnswer) -> Any:
    """The ``ModelInferResponse`` of an answer: outputs as raw contents, in order."""
    response = MESSAGES["ModelInferResponse"](
        model_name=answer.model, model_version=answer.version, id=answer.id or ""
    )
    for key, value in answer.parameters.items():
        param = response.parameters[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        elif value is not None:
            param.string_param = str(value)
    for t in answer.outputs:
        response.outputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        response.raw_output_contents.append(t.as_bytes())
    return response
