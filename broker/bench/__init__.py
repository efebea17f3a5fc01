"""Benchmarks: the figures of docs/design.md §9, each beside its baseline, in one run.

``replaybroker bench [--quick] [--json]`` (``bench.cli``) runs ``bench.runner``; the
sections live in ``fold``, ``restore``, ``pipeline`` (throughput, latency) and ``replay``,
the measured processes in ``workers``, the outputs in ``report``.
"""
