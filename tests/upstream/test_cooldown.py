"""An upstream that is down costs a task attempts only for requests really sent
(docs/upstream.md, "Spreading and failover"): a URL out of cool-down is tried by one
attempt at a time, an attempt that finds every URL cooling sends nothing and is handed
back with its attempt refunded, due when the first cool-down ends, and a claim takes
no more of a model than this process can start: none while its URLs cool down, one for
the probe when a cool-down ends, one among the models sharing a URL (both stores for
what touches the store). A server answering that it is not ready (503 while it loads its
model; 502, 504 from a gateway before it) cools its URL down as one that is down does."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import pytest

from core.clock import iso
from core.engines.base import Chunk, EngineError, EngineOptions, GenerationRequest, UpstreamModel
from core.engines.registry import register_engine
from core.engines.upstream.engine import NAME, OpenAIEngine
from core.engines.upstream.protocol import UNAVAILABLE
from core.engines.upstream.routing import NoUrlNow, Router
from core.models_registry import register_upstream
from core.settings import Settings
from core.states import OnRestart, Status
from core.store import claims, worker_writes
from core.store.database import Database
from scheduler import workers
from scheduler.execute import wait_ms_of
from scheduler.loop import SweeperLoop
from scheduler.workers import Workers
from tests.clocks import HandClock
from tests.scheduler.helpers import event_data
from tests.scheduler.processes import free_port
from tests.store.helpers import events_of, force, task_row
from tests.upstream.helpers import MODEL, add_upstream, enqueue
from tests.upstream.scripted import USAGE, LoopServer, Scripted, chunk, delta, read_request

REQUEST = GenerationRequest([{"role": "user", "content": "count"}], max_output_tokens=4)
LEASE_MS = 60_000
COOLDOWN_SECONDS = 1.0  # the sweeper test's: three fit in test time, a claim polls each


def closed_url() -> str:
    """A base URL nothing listens at: a server that is down."""
    return f"http://127.0.0.1:{free_port()}/v1"


def cooled(router: Router, url: str, seconds: float) -> None:
    """`url`, the only URL of MODEL, as an attempt refused at it leaves it."""
    assert router.pick(MODEL, [url], set()) == url
    router.failed(MODEL, url, UNAVAILABLE, cooldown_seconds=seconds)


def out_of_cool_down(url: str) -> Router:
    """A router of its own whose one URL, `url`, has just left a 10 s cool-down."""
    clock = HandClock(1_000_000)
    router = Router(clock)
    cooled(router, url, 10)
    clock.ms += 10_000
    return router


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> Iterator[Router]:
    """A router of the test's own, used by the engine and by the worker's claims."""
    own = Router()
    register_engine(NAME, partial(OpenAIEngine, router=own))
    monkeypatch.setattr(workers, "ROUTER", own)
    yield own
    register_engine(NAME, OpenAIEngine)


# The router.

def test_a_url_out_of_cool_down_goes_to_one_attempt_until_the_server_answers() -> None:
    url = "http://a.test/v1"
    router = out_of_cool_down(url)

    assert router.pick(MODEL, [url], set()) == url  # the probe
    assert router.pick(MODEL, [url], set()) is None
    assert router.claim_caps() == {MODEL: 0}
    router.answered(url)
    assert router.pick(MODEL, [url], set()) == url
    assert router.pick(MODEL, [url], set()) == url  # no probe once answered
    assert router.claim_caps() == {}


def test_a_failed_probe_cools_its_url_down_again() -> None:
    url = "http://a.test/v1"
    router = out_of_cool_down(url)

    assert router.pick(MODEL, [url], set()) == url
    with router.using(url):
        router.failed(MODEL, url, UNAVAILABLE, cooldown_seconds=10)
    assert router.pick(MODEL, [url], set()) is None
    assert router.cooldown_left_seconds([url]) == 10
    assert router.claim_caps() == {MODEL: 0}


def test_a_probe_that_ends_without_an_answer_frees_its_url() -> None:
    url = "http://a.test/v1"
    router = out_of_cool_down(url)

    with router.using(router.pick(MODEL, [url], set()) or ""):
        assert router.pick(MODEL, [url], set()) is None
    assert router.pick(MODEL, [url], set()) == url


def test_a_model_rests_only_while_every_url_of_it_cools_down() -> None:
    router = Router(HandClock(1_000_000))
    down, up = "http://down.test/v1", "http://up.test/v1"
    assert router.pick(MODEL, [down, up], set()) == down
    router.failed(MODEL, down, UNAVAILABLE, cooldown_seconds=10)
    assert router.claim_caps() == {}
    router.failed(MODEL, up, UNAVAILABLE, cooldown_seconds=10)
    assert router.claim_caps() == {MODEL: 0}


def test_a_claim_takes_one_task_for_the_probe_when_a_cool_down_ends() -> None:
    """Per model, what a claim may take: nothing while cooling, one (the probe) once
    the cool-down ended, and none to the next claims until that task picks its URL or
    the promise lapses; nothing while the probe is out, then all once it is answered;
    a failed probe starts over. A plainly usable URL beside lifts the cap."""
    clock = HandClock(1_000_000)
    router = Router(clock)
    url, other = "http://a.test/v1", "http://b.test/v1"
    cooled(router, url, 10)
    for failure in (True, False):
        assert router.claim_caps() == {MODEL: 0}
        clock.ms += 10_000
        assert router.claim_caps() == {MODEL: 1}
        assert router.claim_caps() == {MODEL: 0}  # promised to the claim before
        clock.ms += 2_000  # that claim took none: the promise lapses
        assert router.claim_caps() == {MODEL: 1}
        assert router.pick(MODEL, [url], set()) == url  # the probe
        assert router.claim_caps() == {MODEL: 0}
        if failure:
            router.failed(MODEL, url, UNAVAILABLE, cooldown_seconds=10)
        else:
            router.answered(url)
    assert router.claim_caps() == {}

    router.failed(MODEL, url, UNAVAILABLE, cooldown_seconds=10)
    assert router.pick(MODEL, [url, other], set()) == other
    clock.ms += 10_000  # `url` awaits its probe, `other` is usable all along
    assert router.claim_caps() == {}


def test_models_sharing_a_url_get_one_probe_task_among_them() -> None:
    """Three models on one base URL: its probe is one task of one of them, not one
    each (the other two would find the URL probed and be handed back). A lapsed
    promise passes to the next model, so one with no task due keeps no one waiting;
    one model alone on a URL still gets its probe each time."""
    clock = HandClock(1_000_000)
    router = Router(clock)
    url, alone = "http://shared.test/v1", "http://alone.test/v1"
    models = ["m1", "m2", "m3"]
    for model in models:
        assert router.pick(model, [url], set()) == url
    router.failed("m1", url, UNAVAILABLE, cooldown_seconds=10)
    assert router.pick("solo", [alone], set()) == alone
    router.failed("solo", alone, UNAVAILABLE, cooldown_seconds=10)
    assert router.claim_caps() == {"m1": 0, "m2": 0, "m3": 0, "solo": 0}
    clock.ms += 10_000

    for turn in [*models, "m1"]:  # each claim took none of the model whose turn it was
        assert router.claim_caps() == {**dict.fromkeys(models, 0), turn: 1, "solo": 1}
        assert router.claim_caps() == {**dict.fromkeys(models, 0), "solo": 0}
        clock.ms += 2_000
    assert router.claim_caps() == {**dict.fromkeys(models, 0), "m2": 1, "solo": 1}
    assert router.pick("m2", [url], set()) == url  # the probe
    assert router.claim_caps() == {**dict.fromkeys(models, 0), "solo": 0}
    router.answered(url)
    assert router.claim_caps() == {"solo": 0}


def test_a_probe_offered_to_a_model_with_none_due_passes_to_the_next_at_once() -> None:
    """Ten models on one base URL, a task due only for the last: each claim that took
    none of the offered model's tasks passes the probe on at once, and the claimer
    claims again at once, so the tenth claim at the cool-down's end takes it (the turn
    passed every 2 s: 18 s later). Tasks of other models taken do not count."""
    clock = HandClock(1_000_000)
    router = Router(clock)
    url = "http://shared.test/v1"
    models = [f"m{i}" for i in range(10)]
    for model in models:
        assert router.pick(model, [url], set()) == url
    router.failed("m0", url, UNAVAILABLE, cooldown_seconds=10)
    clock.ms += 10_000

    for model in models[:-1]:
        assert router.claim_caps() == {**dict.fromkeys(models, 0), model: 1}
        router.claim_took({"elsewhere"})  # none of `model`'s tasks was due
        assert router.caps_lift_in_seconds() == 0
    assert router.claim_caps() == {**dict.fromkeys(models, 0), "m9": 1}
    router.claim_took({"m9"})
    assert router.claim_caps() == dict.fromkeys(models, 0)  # its task is about to pick
    assert router.caps_lift_in_seconds() == 2  # unless the promise lapses first
    assert router.pick("m9", [url], set()) == url  # the probe
    assert router.claim_caps() == dict.fromkeys(models, 0)
    assert router.caps_lift_in_seconds() is None


def test_a_round_of_offers_that_finds_no_task_due_pauses_before_the_next() -> None:
    """Once every model sharing the URL was offered its probe and none had a task due,
    the offers wait `_PROBE_PROMISE_MS` (the claimer sleeps until then), not a round of
    claims at every wake-up; the next round goes on with the next model. A model alone
    on its URL is a round of one."""
    clock = HandClock(1_000_000)
    router = Router(clock)
    url = "http://shared.test/v1"
    models = ["m1", "m2", "m3"]
    for model in models:
        assert router.pick(model, [url], set()) == url
    router.failed("m1", url, UNAVAILABLE, cooldown_seconds=10)
    clock.ms += 10_000

    for _ in range(2):
        for model in models:
            assert router.claim_caps() == {**dict.fromkeys(models, 0), model: 1}
            router.claim_took(set())
        assert router.caps_lift_in_seconds() == 2
        assert router.claim_caps() == dict.fromkeys(models, 0)
        router.claim_took(set())
        assert router.caps_lift_in_seconds() == 2
        clock.ms += 2_000

    alone = out_of_cool_down("http://alone.test/v1")
    assert alone.claim_caps() == {MODEL: 1}
    alone.claim_took(set())
    assert alone.claim_caps() == {MODEL: 0}
    assert alone.caps_lift_in_seconds() == 2


def test_a_claim_held_back_by_a_cool_down_or_a_promise_learns_when_it_may_lift() -> None:
    """What the claimer waits for before it claims again, nothing announcing it: the
    end of the cool-down, then of the probe promised to an earlier claim; nothing
    while no model is held at 0 or the probe is out (its end frees a slot)."""
    clock = HandClock(1_000_000)
    router = Router(clock)
    url = "http://a.test/v1"
    router.claim_caps()
    assert router.caps_lift_in_seconds() is None
    cooled(router, url, 10)
    clock.ms += 4_000
    assert router.claim_caps() == {MODEL: 0}
    assert router.caps_lift_in_seconds() == 6
    clock.ms += 7_000
    assert router.caps_lift_in_seconds() == 0  # passed: claim again at once
    assert router.claim_caps() == {MODEL: 1}
    assert router.caps_lift_in_seconds() is None
    clock.ms += 500
    assert router.claim_caps() == {MODEL: 0}  # promised to the claim before
    assert router.caps_lift_in_seconds() == 1.5
    assert router.pick(MODEL, [url], set()) == url  # the probe
    assert router.claim_caps() == {MODEL: 0}
    assert router.caps_lift_in_seconds() is None


# The engine.

def test_an_attempt_finding_every_url_cooling_sends_nothing_and_says_when_to_return() -> None:
    url = closed_url()
    router = Router()
    cooled(router, url, 7)
    router.take_reports()
    loaded = OpenAIEngine(EngineOptions(upstream_cooldown_seconds=7), router).load(
        UpstreamModel(MODEL, (url,), "smollm2", None, 8, 10))

    with pytest.raises(NoUrlNow) as none:
        list(loaded.generate(REQUEST, None, lambda: False))

    assert 6 <= (none.value.retry_after_seconds or 0) <= 7
    assert none.value.message == f"upstream {url}: in cool-down after failures; no request sent"
    assert not router.take_reports()  # no request, so no error met


def test_an_attempt_finding_its_url_probed_returns_a_cool_down_later() -> None:
    """Another attempt probes the only URL: if that probe fails, the URL cools down
    for the cool-down from about now, so that is when this one comes back."""
    url = closed_url()
    router = Router()
    router.pick(MODEL, [url], set())
    router.failed(MODEL, url, UNAVAILABLE, cooldown_seconds=0.01)
    time.sleep(0.02)
    assert router.pick(MODEL, [url], set()) == url  # another attempt's probe
    loaded = OpenAIEngine(EngineOptions(upstream_cooldown_seconds=7), router).load(
        UpstreamModel(MODEL, (url,), "smollm2", None, 8, 10))

    with pytest.raises(NoUrlNow) as none:
        list(loaded.generate(REQUEST, None, lambda: False))

    assert none.value.retry_after_seconds == 7


def test_a_probe_answered_frees_its_url_while_it_still_streams(
    scripted: Callable[..., Scripted]
) -> None:
    server = scripted([delta("One"), delta(", two"), delta("", "stop"), USAGE,
                       b"data: [DONE]\n\n"])
    router = Router()
    cooled(router, server.base_url, 0.01)
    time.sleep(0.02)
    loaded = OpenAIEngine(EngineOptions(), router).load(
        UpstreamModel(MODEL, (server.base_url,), "smollm2", None, 8, 10))
    others: list[str | None] = []  # what another attempt picks while this one streams

    def emit(chunk: Chunk) -> None:
        others.append(router.pick(MODEL, [server.base_url], set()))

    list(loaded.generate(REQUEST, None, lambda: False, emit))

    assert others and others[0] == server.base_url


# The store: hand-back and claim.

def test_a_handed_back_task_is_queued_until_its_time_with_its_attempt_refunded(
    db: Database
) -> None:
    model = add_upstream(db, [closed_url()])
    [task_id] = enqueue(db, model=model)
    [held] = claims.claim(db, limit=0, upstream_limit=4, lease_ms=LEASE_MS, node_id="n")

    worker_writes.release(db, task_id, held.owner_token, delay_ms=60_000)

    row = task_row(db, task_id)
    assert (row.status, row.attempts, row.owner_token) == (Status.QUEUED, 0, None)
    [queued] = event_data(db, task_id, "response.queued")
    assert queued == {"reason": "released", "attempt": 0, "run_at": iso(row.run_at)}
    assert row.run_at >= db.clock.now_ms() + 59_000
    assert claims.claim(db, limit=0, upstream_limit=4, lease_ms=LEASE_MS, node_id="n") == []


def test_a_handed_back_resume_task_keeps_its_snapshot_and_waits_for_its_time(
    db: Database
) -> None:
    model = add_upstream(db, [closed_url()])
    [task_id] = enqueue(db, model=model, on_restart=OnRestart.RESUME)
    [held] = claims.claim(db, limit=0, upstream_limit=4, lease_ms=LEASE_MS, node_id="n")
    worker_writes.append_output(db, task_id, held.owner_token, [], text="One,",
                                snapshot_json='{"v": 1}', start=True)

    worker_writes.release(db, task_id, held.owner_token, delay_ms=60_000)

    row = task_row(db, task_id)
    assert (row.status, row.attempts, row.snapshot_json) == (Status.RUNNING, 0, '{"v": 1}')
    assert claims.claim(db, limit=0, upstream_limit=4, lease_ms=LEASE_MS, node_id="n") == []
    force(db, task_id, run_at=db.clock.now_ms() - 1)
    [resumed] = claims.claim(db, limit=0, upstream_limit=4, lease_ms=LEASE_MS, node_id="n")
    assert (resumed.task_id, resumed.resumed, resumed.snapshot_json) == (task_id, True,
                                                                         '{"v": 1}')


def test_a_claim_leaves_the_resting_models_tasks_alone(db: Database) -> None:
    model = add_upstream(db, [closed_url()])
    enqueue(db, 2, model=model)

    assert claims.claim(db, limit=0, upstream_limit=4, lease_ms=LEASE_MS, node_id="n",
                        caps={model: 0}) == []
    assert len(claims.claim(db, limit=0, upstream_limit=4, lease_ms=LEASE_MS,
                            node_id="n")) == 2


def test_a_claim_at_a_cool_downs_end_takes_the_probes_task_alone(db: Database) -> None:
    """The others would find the URL being probed and be handed back, each with a
    write and an event: they wait until the server has answered the probe."""
    url = closed_url()
    model = add_upstream(db, [url])
    task_ids = enqueue(db, 5, model=model)
    router = out_of_cool_down(url)

    def claim() -> list[str]:
        return [c.task_id for c in claims.claim(db, limit=0, upstream_limit=8,
                                                lease_ms=LEASE_MS, node_id="n",
                                                caps=router.claim_caps())]

    assert claim() == task_ids[:1]
    assert router.pick(model, [url], set()) == url  # its attempt probes
    assert claim() == []
    router.answered(url)
    assert sorted(claim()) == sorted(task_ids[1:])


def test_a_worker_claims_no_task_of_a_model_whose_every_url_cools_down_here(
    db: Database, quick: Settings, router: Router
) -> None:
    """None while the URL cools down; when the cool-down ends, one for the probe, and
    none to the claim right after it (the worker's next, as it has started work)."""
    url = closed_url()
    model = add_upstream(db, [url])
    task_ids = enqueue(db, 3, model=model)
    cooled(router, url, 60)
    pool = Workers(db, quick)
    try:
        assert pool.claim() == 0
        router.failed(model, url, UNAVAILABLE, cooldown_seconds=0.01)
        time.sleep(0.02)
        assert pool.claim() == 1
        assert pool.claim() == 0
    finally:
        pool.stop(drain_seconds=0)
    rows = [task_row(db, t) for t in task_ids]
    assert sum(row.attempts for row in rows) <= 1
    assert sum(row.status == Status.QUEUED and row.attempts == 0 for row in rows) >= 2


# A sweeper against a server that is down.

def queued_events(db: Database, task_ids: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """Every `response.queued` event of the tasks: when it was logged, and its data."""
    return [(e.created_at, json.loads(e.data)) for t in task_ids for e in events_of(db, t)
            if e.type == "response.queued"]


def test_a_server_that_stays_down_costs_one_attempt_per_cool_down_not_one_per_task(
    db: Database, quick: Settings, router: Router
) -> None:
    """Five tasks, the only URL already cooling down: over three cool-downs at most one
    probe per cool-down reaches the server, and no other task is claimed only to be
    handed back (before the stop hands back what it holds)."""
    settings = replace(quick, upstream_cooldown_seconds=COOLDOWN_SECONDS)
    url = closed_url()
    model = add_upstream(db, [url])
    cooled(router, url, COOLDOWN_SECONDS)
    task_ids = enqueue(db, 5, model=model, max_attempts=5, max_output_tokens=4)
    loop = SweeperLoop(db, settings)

    loop.start()
    try:
        time.sleep(3.5 * COOLDOWN_SECONDS)
        stopping_at = db.clock.now_ms()
    finally:
        loop.stop()

    rows = [task_row(db, t) for t in task_ids]
    assert all(row.status == Status.QUEUED for row in rows)  # none failed, none dead-lettered
    spent = sum(row.attempts for row in rows)
    assert 1 <= spent <= 4, f"{spent} attempts spent in 3.5 cool-downs"
    events = queued_events(db, task_ids)
    retries = [data for _, data in events if data["reason"] == "retry"]
    assert len(retries) == spent  # each spent attempt was a request the server refused
    assert all(e["error"]["message"] == f"upstream {url}: connection failed" for e in retries)
    released = [data for at, data in events
                if data["reason"] == "released" and at < stopping_at]  # not the stop's
    assert released == []


def test_a_task_held_back_by_a_cool_down_is_claimed_when_it_ends_not_a_poll_later(
    db: Database, quick: Settings, router: Router, scripted: Callable[..., Scripted]
) -> None:
    """Nothing announces a cool-down's end: the claimer, held back by it, wakes for it
    itself. With polls seconds apart (pushed wake-ups on PostgreSQL), the task waited
    for the next poll, up to a poll interval past the end."""
    cooldown_ms = 1_000
    server = scripted([delta("One"), delta("", "stop"), USAGE, b"data: [DONE]\n\n"])
    model = add_upstream(db, [server.base_url])
    cooling_from = db.clock.now_ms()
    cooled(router, server.base_url, cooldown_ms / 1000)
    [task_id] = enqueue(db, model=model, max_output_tokens=4)
    loop = SweeperLoop(db, replace(quick, poll_interval_ms=5_000))

    loop.start()
    try:
        deadline = time.monotonic() + cooldown_ms / 1000 + 2
        while task_row(db, task_id).status != Status.COMPLETED and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        loop.stop()

    claimed_at = [e.created_at for e in events_of(db, task_id) if e.type == "response.loading"]
    assert len(claimed_at) == 1, "not claimed within 2 s of the cool-down's end"
    late = claimed_at[0] - (cooling_from + cooldown_ms)  # the end is no earlier
    assert 0 <= late <= 300, f"claimed {late} ms after the cool-down ended"
    assert task_row(db, task_id).status == Status.COMPLETED


def test_a_task_of_the_tenth_model_sharing_a_url_is_claimed_when_its_cool_down_ends(
    db: Database, quick: Settings, router: Router, scripted: Callable[..., Scripted]
) -> None:
    """Ten models on one URL that cooled down, a task due for the last alone: the probe
    is offered to each in turn, and a claim that took none of the offered model's tasks
    passes it on at once. It passed every 2 s: the task was claimed 18 s after the end
    (~100 s with fifty models). No task is claimed only to be handed back."""
    cooldown_ms = 1_000
    server = scripted([delta("One"), delta("", "stop"), USAGE, b"data: [DONE]\n\n"])
    models = [f"m{i}" for i in range(10)]
    for model in models:
        register_upstream(db, model, base_urls=[server.base_url], model="smollm2")
        assert router.pick(model, [server.base_url], set()) == server.base_url
    cooling_from = db.clock.now_ms()
    router.failed(models[0], server.base_url, UNAVAILABLE, cooldown_seconds=cooldown_ms / 1000)
    [task_id] = enqueue(db, model=models[-1], max_output_tokens=4)
    loop = SweeperLoop(db, replace(quick, poll_interval_ms=5_000))

    loop.start()
    try:
        deadline = time.monotonic() + cooldown_ms / 1000 + 3
        while task_row(db, task_id).status != Status.COMPLETED and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        loop.stop()

    events = events_of(db, task_id)
    claimed_at = [e.created_at for e in events if e.type == "response.loading"]
    assert len(claimed_at) == 1, "not claimed within 3 s of the cool-down's end"
    late = claimed_at[0] - (cooling_from + cooldown_ms)  # the end is no earlier
    assert 0 <= late <= 1_000, f"claimed {late} ms after the cool-down ended"
    assert [e for e in events if e.type == "response.queued"
            and json.loads(e.data)["reason"] == "released"] == []
    assert task_row(db, task_id).status == Status.COMPLETED


def test_the_wait_an_engine_error_asks_for_is_rounded_up_to_whole_milliseconds() -> None:
    waits = [wait_ms_of(EngineError(UNAVAILABLE, "x", retryable=True,
                                    retry_after_seconds=ms / 1000)) for ms in range(1, 5000)]
    assert waits == list(range(1, 5000))


# A server answering that it is not ready.

class NotReady(LoopServer):
    """A stand-in for a server restarting, outside this process: it answers `status`
    (with `Retry-After: retry_after`, if given) until `ready` is set, then a short
    answer. llama-server answers 503 "Loading model" so while it loads its weights,
    for seconds to minutes; this one is told when to stop."""

    def __init__(self, status: int = 503, retry_after: str | None = None) -> None:
        self.status = status
        self.retry_after = retry_after
        self.ready = False
        self.not_ready_answers = 0
        super().__init__()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
            if self.ready:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                for data in (delta("One"), delta("", "stop"), USAGE, b"data: [DONE]\n\n"):
                    writer.write(chunk(data))
                writer.write(b"0\r\n\r\n")
            else:
                self.not_ready_answers += 1
                body = b'{"error":{"code":503,"message":"Loading model"}}'
                retry = f"Retry-After: {self.retry_after}\r\n" if self.retry_after else ""
                writer.write(f"HTTP/1.1 {self.status} Unavailable\r\n{retry}Content-Length: "
                             f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@pytest.fixture
def not_ready() -> Iterator[Callable[..., NotReady]]:
    servers: list[NotReady] = []

    def make(status: int = 503, retry_after: str | None = None) -> NotReady:
        servers.append(NotReady(status, retry_after))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


def test_a_server_not_ready_cools_its_url_down_for_its_retry_after_or_the_cool_down(
    not_ready: Callable[..., NotReady]
) -> None:
    """A 503 (or a gateway's 502, 504) is no answer to a probe: the URL cools down, for
    the `Retry-After` given, else as long as after a refused connection, and the
    attempt stays retryable. A 500 or a 429 cools nothing down."""
    cases = [(503, None, 60.0), (503, "2", 2.0), (503, "0", 60.0), (502, None, 60.0),
             (504, "3", 3.0), (500, None, 0.0), (429, "2", 0.0)]
    for status, retry_after, cooldown in cases:
        server = not_ready(status, retry_after)
        router = out_of_cool_down(server.base_url)
        loaded = OpenAIEngine(EngineOptions(upstream_cooldown_seconds=60), router).load(
            UpstreamModel(MODEL, (server.base_url,), "smollm2", None, 8, 10))

        with pytest.raises(EngineError) as failed:
            list(loaded.generate(REQUEST, None, lambda: False))

        assert failed.value.retryable, status
        left = router.cooldown_left_seconds([server.base_url])
        assert cooldown - 1 < left <= cooldown if cooldown else left == 0, (status, left)
        assert router.claim_caps() == ({MODEL: 0} if cooldown else {}), status
        assert server.not_ready_answers == 1


def test_a_server_loading_its_model_costs_one_attempt_per_cool_down_not_the_backlog(
    db: Database, quick: Settings, router: Router, not_ready: Callable[..., NotReady]
) -> None:
    """A server killed and restarted answers 503 while it loads (tests/rt: llama-server).
    Five tasks of three attempts wait for it, the URL cooling down from the refused
    connections before: each cool-down sends one probe, answered 503, and the others
    are not claimed; none is dead-lettered, and once the server serves they complete.
    Taken as an answer, the probe's 503 released all five to it, each spending its
    three attempts on 503s within a second."""
    cooldown = 0.25
    settings = replace(quick, upstream_cooldown_seconds=cooldown)
    server = not_ready()
    model = add_upstream(db, [server.base_url])
    cooled(router, server.base_url, cooldown)
    task_ids = enqueue(db, 5, model=model, max_attempts=3, max_output_tokens=4)
    loop = SweeperLoop(db, settings)

    loop.start()
    try:
        deadline = time.monotonic() + 10
        while server.not_ready_answers == 0:  # the first probe: the loop has started
            assert time.monotonic() < deadline, "no probe reached the server"
            time.sleep(0.01)
        time.sleep(3 * cooldown)
        loading_ended = db.clock.now_ms()
        server.ready = True
        deadline = time.monotonic() + 10
        while not all(task_row(db, t).status == Status.COMPLETED for t in task_ids):
            assert all(task_row(db, t).status != Status.FAILED for t in task_ids)
            assert time.monotonic() < deadline, "the tasks did not complete"
            time.sleep(0.05)
    finally:
        loop.stop()

    assert 1 <= server.not_ready_answers <= 5, f"{server.not_ready_answers} probes answered 503"
    events = queued_events(db, task_ids)
    retries = [data for _, data in events if data["reason"] == "retry"]
    assert len(retries) == server.not_ready_answers
    assert all(e["error"]["message"] == f"upstream {server.base_url} answered 503"
               for e in retries)
    assert [data for at, data in events if data["reason"] == "released"
            and at < loading_ended] == []
