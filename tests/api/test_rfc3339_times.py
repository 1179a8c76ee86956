"""`run_at` is RFC 3339's `date-time` to the letter, read by `core.clock.parse_time`
(docs/http-api.md, creating a response): ISO 8601's other forms a lenient parser takes
are refused with the 422 every `run_at` fault gets, and store nothing."""

from __future__ import annotations

from typing import Any

from tests.api.helpers import Caller
from tests.api.test_errors import assert_problem

# What is sent -> the `run_at` the task shows (UTC, milliseconds).
ACCEPTED = {
    "2100-01-01T10:20:00Z": "2100-01-01T10:20:00.000Z",
    "2100-01-01T10:20:00.123+01:00": "2100-01-01T09:20:00.123Z",
    "2100-01-01T10:20:00.1239999999Z": "2100-01-01T10:20:00.123Z",  # cut, never rounded up
    "2100-01-01T10:20:00-00:00": "2100-01-01T10:20:00.000Z",
    "2100-01-01T10:20:00+23:59": "2099-12-31T10:21:00.000Z",
    "2100-01-01t10:20:00z": "2100-01-01T10:20:00.000Z",  # RFC 3339's ABNF ignores case
    "2100-01-01 10:20:00Z": "2100-01-01T10:20:00.000Z",  # its note allows the space
}

REFUSED = [
    "2100-01-01T10:20:00+0100",  # an offset without its colon
    "2100-01-01T10:20:00+01",  # without its minutes
    "2100-01-01T10:20Z",  # no seconds
    "2100-01-01T10Z",
    "2100-01-01T10:20:00,5Z",  # a comma fraction
    "2100-01-01T10:20:00.Z",  # a dot without digits
    "2100-01-01_10:20:00Z",  # another separator
    "20000101T102000Z",  # ISO 8601's basic format
    "2100-01-01T1:20:00Z",
    "2100-01-01T10:20:00",  # no offset
    "2100-01-01",
    "2100-01-01T24:00:00Z",
    "2100-01-01T10:20:60Z",  # a leap second: no datetime holds it
    "2100-01-01T10:20:00+24:00",
    "2100-01-01T10:20:00+01:60",
    "2100-02-29T10:20:00Z",  # 2100 is not a leap year
    "2100-13-01T10:20:00Z",
    "0000-01-01T10:20:00Z",
    " 2100-01-01T10:20:00Z",
    "2100-01-01T10:20:00Z\n",
    "2100-01-01T10:20:00ZZ",
    "\uff12\uff11\uff10\uff10-01-01T10:20:00Z",  # full-width digits
]


def _create(who: Caller, model_id: str, run_at: str) -> Any:
    return who.post("/v1/responses", json={"model": model_id, "input": "words=3",
                                           "run_at": run_at})


def test_a_run_at_outside_rfc_3339_is_refused_naming_run_at_and_stores_nothing(
    alice: Caller, model_id: str
) -> None:
    for run_at in REFUSED:
        problem = assert_problem(_create(alice, model_id, run_at), 422, "validation_error")
        assert [error["field"] for error in problem["errors"]] == ["run_at"], run_at
        assert run_at.strip() not in problem["detail"], run_at
    assert alice.get("/v1/tasks").json()["data"] == []


def test_every_rfc_3339_form_is_accepted_at_its_instant(alice: Caller, model_id: str) -> None:
    for run_at, shown in ACCEPTED.items():
        answer = _create(alice, model_id, run_at)
        assert answer.status_code == 202, (run_at, answer.text)
        task = alice.get(f"/v1/tasks/{answer.json()['id']}").json()
        assert task["run_at"] == shown, run_at
