"""The gRPC messages the server loads are the .proto's, and live apart from tritonclient's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

from gnnserve.server.oip_grpc_messages import DESCRIPTORS, MESSAGES


def test_the_descriptor_set_is_the_proto_compiled(tmp_path: Path) -> None:
    """`make proto` was run after the last change of the .proto."""
    out = tmp_path / "fresh.binpb"
    proto = DESCRIPTORS.with_suffix(".proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}",
         f"--descriptor_set_out={out}", str(proto)],
        check=True,
    )  # fmt: skip
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes()) == fresh


def test_messages_decode_what_tritonclient_encodes() -> None:
    """Same wire format as Triton's messages, though both are loaded in one process."""
    from tritonclient.grpc import service_pb2

    theirs = service_pb2.ModelInferRequest(model_name="m", id="7")
    tensor = theirs.inputs.add(name="node_ids", datatype="INT64", shape=[2])
    tensor.contents.int64_contents.extend([4, 9])
    theirs.parameters["fanouts"].string_param = "2,2"
    theirs.parameters["gamma"].double_param = 0.5
    ours = MESSAGES["ModelInferRequest"].FromString(theirs.SerializeToString())
    assert ours.model_name == "m" and ours.id == "7"
    assert list(ours.inputs[0].contents.int64_contents) == [4, 9]
    assert ours.parameters["fanouts"].string_param == "2,2"
    assert ours.parameters["gamma"].double_param == 0.5
