"""`GET /metrics`: the queue's figures in the Prometheus text format.

Open like the probes, so a scraper needs no token: counts, plus the upstream models'
ids and base URLs as labels of their series (never a task or client id, a payload, a
key or a client name), which is why docs/operations.md keeps it on the monitoring
network. Figures come from the store at scrape time (`core.store.queue_stats`), the
same from every process; what to alert on is in docs/operations.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from litestar import Response, get
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from core.store.database import Database
from core.store.queue_stats import QueueStats, queue_stats
from core.store.upstream_health import UpstreamStats, upstream_stats
from handlers.auth import PUBLIC_ROUTE
from handlers.heads import head_of
from handlers.services import Services
from handlers.threads import blocking


class _Snapshot(Collector):
    """A prometheus_client collector that yields one read of the store."""

    def __init__(self, stats: QueueStats, upstreams: UpstreamStats, now_ms: int) -> None:
        self._stats = stats
        self._upstreams = upstreams
        self._now_ms = now_ms

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        by_status = GaugeMetricFamily("taskward_tasks", "Tasks in each active state.",
                                      labels=["status"])
        for status, count in stats.by_status.items():
            by_status.add_metric([status.value], count)
        yield by_status
        yield GaugeMetricFamily(
            "taskward_tasks_due",
            "Tasks a claim may take now: queued ones whose run_at has come, and running "
            "ones handed back without a lease.", value=stats.due)
        # A hand-back's time comes from the clock of the process that wrote it, which
        # may run a little ahead of this one's: a wait is never below 0.
        waited_ms = 0 if stats.oldest_due_at is None else max(
            0, self._now_ms - stats.oldest_due_at)
        yield GaugeMetricFamily("taskward_oldest_due_task_age_seconds",
                                "How long the longest-waiting due task has waited (0: none).",
                                value=waited_ms / 1000)
        yield GaugeMetricFamily(
            "taskward_expired_leases",
            "Tasks a sweeper pass must take back: leases past their end, and cancelling "
            "tasks nobody holds.", value=stats.expired_leases)
        yield GaugeMetricFamily("taskward_dead_letters",
                                "Failed tasks whose attempts were spent.",
                                value=stats.dead_letters)
        yield from _upstream_metrics(self._upstreams)


def _upstream_metrics(stats: UpstreamStats) -> Iterator[Metric]:
    """Per upstream model (docs/upstream.md): attempts in flight fleet-wide (what its
    `max_concurrency` bounds), errors by code, base URLs in cool-down."""
    in_flight = GaugeMetricFamily("taskward_upstream_in_flight",
                                  "Attempts in flight on an upstream model, fleet-wide.",
                                  labels=["model"])
    for model, count in stats.in_flight.items():
        in_flight.add_metric([model], count)
    yield in_flight
    errors = CounterMetricFamily("taskward_upstream_errors",
                                 "Upstream failures seen by sweepers, by error code.",
                                 labels=["model", "code"])
    for (model, code), count in sorted(stats.errors.items()):
        errors.add_metric([model, code], count)
    yield errors
    cooling = GaugeMetricFamily("taskward_upstream_cooldown",
                                "1 for a base URL sweepers skip after failures.",
                                labels=["model", "base_url"])
    for model, urls in stats.cooling.items():
        for url in urls:
            cooling.add_metric([model, url], 1)
    yield cooling


def _exposition(db: Database) -> bytes:
    now = db.clock.now_ms()
    stats = queue_stats(db, now)
    upstreams = upstream_stats(db, now)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(stats, upstreams, now))
    return generate_latest(registry)


# The 0.0.4 text format: every Prometheus version reads it, and these names need none of
# the escaping the newer format adds. Litestar appends the charset to text types itself.
_TEXT_FORMAT = "text/plain; version=0.0.4"


@get("/metrics", opt=PUBLIC_ROUTE, tags=["health"], media_type=_TEXT_FORMAT)
async def metrics(services: Services) -> Response[bytes]:
    return Response(await blocking(_exposition, services.db), media_type=_TEXT_FORMAT)


# HEAD as the probes answer it (a load balancer or uptime check probing with HEAD saw
# 405): the scrape is read and its body dropped, so the status is the one GET answers.
ROUTES = [metrics, head_of(metrics)]
