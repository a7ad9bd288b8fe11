"""What a client reads when instances fail: gnnserve's own reasons, never a process's pid,
address or Ray's terminal colour codes (those go to the log)."""

from __future__ import annotations

from gnnserve.deploy.faas.launch import InstanceDiedError
from gnnserve.deploy.faas.pool import _reason
from gnnserve.errors import InvalidInputError

RAY_TEXT = (
    "\x1b[36mray::RemoteInstance.__init__()\x1b[39m (pid=41234, ip=10.0.0.7, "
    "actor_id=8f2c0a1b) The actor died unexpectedly before finishing this task."
)


def test_a_clients_reason_holds_no_process_details() -> None:
    for cause in (RuntimeError(RAY_TEXT), InstanceDiedError(RAY_TEXT, "instance")):
        text = _reason(cause)
        assert "pid" not in text and "10.0.0.7" not in text and "\x1b" not in text
        assert "server log" in text
    own = InvalidInputError("fanouts [4, 4] do not match [25, 10]", "sampler.fanouts")
    assert _reason(own) == "fanouts [4, 4] do not match [25, 10]"
