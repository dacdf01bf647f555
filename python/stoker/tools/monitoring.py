"""Prometheus metrics for a loader (``pip install stoker[prometheus]``).

    import stoker.tools.monitoring
    stoker.tools.monitoring.serve_prometheus(loader, port=9300)   # http://host:9300/metrics

or register the collector with your own registry::

    from prometheus_client import REGISTRY
    REGISTRY.register(stoker.tools.monitoring.LoaderCollector(loader))

Metrics (label ``loader`` names the loader, ``worker`` the worker id):

* ``stoker_batches_yielded_total``, ``stoker_data_wait_seconds_total``, ``stoker_data_stall_ratio``
* ``stoker_worker_samples_total``, ``stoker_worker_batches_total``,
  ``stoker_worker_seconds_total{stage="getitem|collate|encode|idle"}``,
  ``stoker_worker_rss_bytes``, ``stoker_worker_restarts_total``
* ``stoker_slot_bytes{kind="mapped|held_by_user|waiting"}``
* ``stoker_worker_deaths_total``, ``stoker_samples_skipped_total``

Thread contract: ``collect`` runs on prometheus_client's scrape thread while the training
loop iterates; it reads ``stoker.stats(loader)``, which is safe from any thread.
"""

from __future__ import annotations

import weakref

from ..loader.iterators.stats import loader_stats


class LoaderCollector:
    """A prometheus_client collector reading ``stoker.stats(loader)`` at each scrape (any loader
    stoker serves, a torch one under ``enable()`` too)."""

    def __init__(self, loader, name: str = "default"):
        self._loader = weakref.ref(loader)
        self._name = name

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        loader = self._loader()
        if loader is None:
            return
        s = loader_stats(loader)
        lab = [self._name]
        fams = []

        def counter(name, doc, value, labels=(), label_values=()):
            f = CounterMetricFamily(name, doc, labels=["loader", *labels])
            f.add_metric(lab + list(label_values), value)
            fams.append(f)

        def gauge(name, doc, value):
            f = GaugeMetricFamily(name, doc, labels=["loader"])
            f.add_metric(lab, value)
            fams.append(f)

        counter("stoker_batches_yielded", "Batches handed to the training loop.",
                s["batches_yielded"])
        counter("stoker_data_wait_seconds", "Seconds the training loop waited for data.",
                s["seconds_waiting_for_data"])
        gauge("stoker_data_stall_ratio", "Share of the loop's time spent waiting for data.",
              s["data_stall"])
        counter("stoker_worker_deaths", "Worker deaths since the loader was made.",
                len(s["deaths"]))
        counter("stoker_samples_skipped", "Samples skipped (on_error='skip', quarantine).",
                len(s["skipped"]))
        samples = CounterMetricFamily("stoker_worker_samples", "Samples loaded by a worker.",
                                      labels=["loader", "worker"])
        batches = CounterMetricFamily("stoker_worker_batches", "Batches sent by a worker.",
                                      labels=["loader", "worker"])
        seconds = CounterMetricFamily("stoker_worker_seconds", "Worker time by stage.",
                                      labels=["loader", "worker", "stage"])
        rss = GaugeMetricFamily("stoker_worker_rss_bytes", "Worker resident memory.",
                                labels=["loader", "worker"])
        restarts = CounterMetricFamily("stoker_worker_restarts", "Restarts of a worker this epoch.",
                                       labels=["loader", "worker"])
        for w in s["workers"]:
            wl = lab + [str(w["id"])]
            restarts.add_metric(wl, w["restarts"])
            if "samples" not in w:
                continue
            samples.add_metric(wl, w["samples"])
            batches.add_metric(wl, w["batches"])
            rss.add_metric(wl, w["rss_bytes"])
            for stage, v in w["seconds"].items():
                seconds.add_metric(wl + [stage], v)
        fams += [samples, batches, seconds, rss, restarts]
        slot = GaugeMetricFamily("stoker_slot_bytes", "Shared-memory slot bytes.",
                                 labels=["loader", "kind"])
        mem = s.get("memory") or {}
        for kind, key in (("mapped", "bytes_mapped"), ("held_by_user", "bytes_held_by_user"),
                          ("waiting", "bytes_waiting")):
            slot.add_metric(lab + [kind], mem.get(key, 0))
        fams.append(slot)
        yield from fams


class MetricsServer:
    """What ``serve_prometheus`` started: its ``registry``, the ``port`` it listens on, and
    ``close()``, which stops the server and joins its thread (also on leaving a ``with``)."""

    def __init__(self, registry, server, thread):
        self.registry = registry
        self.port = server.server_port
        self._server, self._thread = server, thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_prometheus(loader, port: int, addr: str = "0.0.0.0", name: str = "default"):
    """Serves ``loader``'s metrics at ``http://addr:port/metrics`` from a daemon thread (start it
    after the loader has started its workers, or from the main process only: a process that
    forks workers while the server's thread runs is warned). Returns a ``MetricsServer``
    (``.registry``, ``.port``, ``.close()``); ``port=0`` takes a free one."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(LoaderCollector(loader, name))
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(registry, server, thread)
