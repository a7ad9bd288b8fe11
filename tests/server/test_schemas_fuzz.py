"""Property-based run of schemathesis against the live server's OpenAPI schema: no 5xx.

Driven through schemathesis' strategy API with hypothesis directly (its pytest plugin does not
work with the pytest version installed here), a bounded number of examples per operation.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

EXAMPLES_PER_OPERATION = 30


def test_no_server_errors_on_any_operation(live_server: str) -> None:
    schema = schemathesis.openapi.from_url(f"{live_server}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/predict", "/v2/models/{name}/infer"}
    sent: list[int] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case) -> None:  # type: ignore[no-untyped-def]
            response = case.call(base_url=live_server, timeout=30)
            sent.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, case.body, response.text)
            if response.status_code >= 400:
                assert "error" in response.json(), response.text

        check()
    assert len(sent) >= len(operations) and any(code >= 400 for code in sent)
