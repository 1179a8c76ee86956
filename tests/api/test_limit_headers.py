"""The `x-ratelimit-*` values of a 429 in the forms clients parse: the reset as a Go
duration (`20ms`, `1s`, `6m0s`, `1h2m3s`) whose parts never overflow, the limit as a
plain number (no exponent, no digits cut)."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from core.quotas import Limits
from core.store.clients import create_client
from core.store.database import Database
from handlers.limits import limit_header, reset_header
from tests.api.helpers import Caller


@pytest.mark.parametrize(("seconds", "header"), [
    (0.0, "1ms"), (0.0001, "1ms"), (0.02, "20ms"), (0.999, "999ms"),
    (0.9999, "1s"), (1.0, "1s"), (1.2, "2s"), (59.0, "59s"), (59.5, "1m0s"),
    (60.0, "1m0s"), (119.5, "2m0s"), (179.2, "3m0s"), (360.0, "6m0s"),
    (3599.5, "1h0m0s"), (3723.0, "1h2m3s"), (7200.0, "2h0m0s"), (86_400.0, "24h0m0s"),
])
def test_the_reset_is_rounded_up_whole_then_split_into_hours_minutes_and_seconds(
    seconds: float, header: str
) -> None:
    assert reset_header(seconds) == header


@pytest.mark.parametrize(("limit", "header"), [
    (1, "1"), (3.0, "3"), (1_234_567, "1234567"), (1_234_567.0, "1234567"),
    (0.5, "0.5"), (0.1234567, "0.1234567"), (1e-05, "0.00001"), (2.5e-07, "0.00000025"),
    (1234.5678901, "1234.5678901"),
])
def test_the_limit_is_written_whole_or_in_full_without_an_exponent(
    limit: float, header: str
) -> None:
    assert limit_header(limit) == header


def test_a_limited_client_is_told_its_rate_and_wait_in_those_forms(
    db: Database, http: TestClient[Any]
) -> None:
    """One request every 119.5 s: the wait was written `1m60s`, the rate `0.0083682`."""
    rate = 1 / 119.5
    issued = create_client(db, name="slow", scopes=frozenset({"tasks:read"}),
                           limits=Limits(requests_per_second=rate))
    slow = Caller(http, issued.token, issued.client_id)
    assert slow.get("/v1/tasks").status_code == 200
    refused = slow.get("/v1/tasks")
    assert refused.status_code == 429
    assert refused.headers["x-ratelimit-reset-requests"] == "2m0s"
    assert float(refused.headers["x-ratelimit-limit-requests"]) == rate
    assert "e" not in refused.headers["x-ratelimit-limit-requests"]
