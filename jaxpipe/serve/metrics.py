"""Prometheus metrics of one server app, on a registry of its own (several apps can live in one process).

Exposed at ``GET /metrics`` (``Metrics.render``):

* ``jaxpipe_queue_depth``: admitted requests not started yet.
* ``jaxpipe_running_requests``: admitted requests started and not finished.
* ``jaxpipe_running_rows``: batch rows that stepped in the engine's last tick.
* ``jaxpipe_memory_bytes``: the memory estimates of the admitted, unfinished requests.
* ``jaxpipe_engine_ticks_total``: engine ticks (each one loop step of every running request).
* ``jaxpipe_steps_per_second``: engine ticks per second over the last 10 s.
* ``jaxpipe_admissions_refused_total{reason}``: refused requests (``queue``, ``memory``, ``never_fits``,
  ``draining``, ``invalid``, ``unknown_model``).
* ``jaxpipe_requests_total{model, status}``: finished requests (``completed``, ``failed``, ``cancelled``).
* ``jaxpipe_request_latency_seconds{endpoint, model}``: a histogram of request latency, from arrival to
  the response (images) or to the job's end (videos).

The gauges and counters are read from the ``Front`` when scraped (the front keeps plain counts; it
never imports prometheus_client), the latency histogram is observed by the routes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from jaxpipe.serve.front import Front

__all__ = ["Metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format's media type."""

_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Metrics:
    """The metrics of one app over ``front``, on their own ``CollectorRegistry``.

    Args:
      front: the front whose load and counts are reported.
    """

    def __init__(self, front: Front):
        self.front = front
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "jaxpipe_request_latency_seconds",
            "Request latency, arrival to response or job end.",
            ("endpoint", "model"),
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_FrontCollector(front))

    def observe(self, endpoint: str, model: str, seconds: float) -> None:
        """Record one request's latency.

        Args:
          endpoint: the route's short name (``"images"``, ``"videos"``, ``"chat"``, ``"rewards"``).
          model: the model id it asked for.
          seconds: arrival to response (or job end).
        """
        self.latency.labels(endpoint, model).observe(seconds)

    def render(self) -> bytes:
        """The registry in the Prometheus text format (``generate_latest``)."""
        return generate_latest(self.registry)


class _FrontCollector:
    """Reads the front's load and counts at scrape time."""

    def __init__(self, front: Front):
        self._front = front

    def describe(self):
        return []  # metrics are read from the front at collection only

    def collect(self):
        front = self._front
        load = front.load()
        refused_by, finished_by = front.counts()
        for name, doc, value in (
            ("jaxpipe_queue_depth", "Admitted requests not started yet.", load.queued),
            ("jaxpipe_running_requests", "Admitted requests started and not finished.", load.running),
            ("jaxpipe_running_rows", "Batch rows that stepped in the engine's last tick.", load.rows),
            ("jaxpipe_memory_bytes", "Memory estimates of the admitted, unfinished requests.", load.memory_bytes),
            ("jaxpipe_steps_per_second", "Engine ticks per second over the last 10 s.", front.steps_per_second()),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        yield CounterMetricFamily(
            "jaxpipe_engine_ticks", "Engine ticks (one loop step of every running request).", value=front.ticks
        )
        refused = CounterMetricFamily(
            "jaxpipe_admissions_refused", "Requests refused at admission, by reason.", labels=("reason",)
        )
        for reason, count in sorted(refused_by.items()):
            refused.add_metric((reason,), count)
        yield refused
        finished = CounterMetricFamily(
            "jaxpipe_requests", "Finished requests, by model and status.", labels=("model", "status")
        )
        for (model, status), count in sorted(finished_by.items()):
            finished.add_metric((model, status), count)
        yield finished
