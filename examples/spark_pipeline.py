"""Spark: a Structured Streaming query under the guarantee, the acker in this process.

    python examples/spark_pipeline.py [--bootstrap HOST:PORT] [--records 1000] [--keep] [-v]

Needs the spark extra (``.ci/bootstrap`` installs it) and Java. A source sends payments
(every 250th one unparsable: dead-lettered after 2 attempts); the query of
``spark_jobs/quickstart.py`` - an existing ``foreachBatch`` job pointed at ``payments`` and
``payments.replay``, wrapped in ``Acking`` - writes the parsed ones to a Parquet sink that
keeps one row per (origin, path). The last line on stdout is the JSON summary from ground
truth (the persist topic's tombstones and the sink's rows); exit code 0 only when nothing is
lost.
"""

from __future__ import annotations

import sys
import tempfile

import orjson

from broker import Acker, AckerConfig, KafkaSettings, Namespace, Source, SourceConfig
from broker.completions import OutcomeTail
from broker.dev.examples import namespace, parse_args, report, wait_for_outcomes
from spark_jobs import OriginParquetSink, build_spark_session
from spark_jobs.quickstart import start_payments_query


def run(settings: KafkaSettings, ns: Namespace, records: int, tail: OutcomeTail) -> int:
    payments = f"{ns.name}.payments"
    spark = build_spark_session("replaybroker-example")
    workdir = tempfile.mkdtemp(prefix="replaybroker-spark-example-")
    out, checkpoint = f"{workdir}/payments", f"{workdir}/checkpoint"
    with (
        Acker(settings, ns, AckerConfig(instance_id=f"{ns.name}-acker")).run_in_background(),
        Source(settings, ns, SourceConfig(timeout_ms=120_000, max_attempts=2)) as source,  # micro-batches take s
    ):
        query = start_payments_query(spark, settings.bootstrap_servers, ns.name, payments, out, checkpoint)
        try:
            sent = {i: source.send(payments, f"acct-{i % 13}",
                                   b"not json" if i % 250 == 0 else orjson.dumps({"amount": i})).origin
                    for i in range(records)}
            source.flush()
            wait_for_outcomes(tail, records, timeout_s=300)
        finally:
            query.stop()
    written = {row["origin"] for row in OriginParquetSink(out).read(spark).select("origin").collect()}
    id_of = {origin: i for i, origin in sent.items()}
    return report(tail, sent, {id_of[o] for o in written if o in id_of})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    with namespace(args, "spark", {"payments": 2}, partitions=2) as (settings, ns, tail):
        return run(settings, ns, args.records, tail)


if __name__ == "__main__":
    sys.exit(main())
