"""Bridge: put a topic written by producers you do not control under the guarantee.

    python examples/bridge_pipeline.py [--bootstrap HOST:PORT] [--records 1000] [--keep] [-v]

A plain producer (another team's service) writes clicks to ``<ns>.clicks``; the bridge reads
them and sends each through a transactional ``Source`` into ``<ns>.clicks.guaranteed``, its
input offsets committed in the same transaction; a task counts the clicks per page and acks.
As a service the bridge is ``replaybroker bridge --namespace NS --from clicks``. The last
line on stdout is the JSON summary from ground truth (exit code 0 only when nothing is lost).
"""

from __future__ import annotations

import sys
from collections import Counter

from confluent_kafka import Producer

from broker import (
    Acker,
    AckerConfig,
    Bridge,
    BridgeConfig,
    KafkaSettings,
    Namespace,
    Task,
    TaskContext,
    TaskRecord,
)
from broker.completions import OutcomeTail
from broker.dev.examples import namespace, parse_args, report, wait_for_outcomes
from broker.dev.testing import create_topics


def run(settings: KafkaSettings, ns: Namespace, records: int, tail: OutcomeTail) -> int:
    clicks, guaranteed = f"{ns.name}.clicks", f"{ns.name}.clicks.guaranteed"
    sent: dict[bytes, int] = {}  # click id -> origin, as the bridge gave it
    per_page: Counter[bytes] = Counter()  # the outside world: clicks per page
    counted: set[bytes] = set()

    def count(record: TaskRecord, ctx: TaskContext) -> None:
        click_id, page = (record.value or b"").split(b" ", 1)
        if click_id not in counted:  # a replay of a click counted already adds nothing
            counted.add(click_id)
            per_page[page] += 1
        if record.tracking:
            sent[click_id] = record.tracking.origin  # ground truth: which origin carried it

    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})  # not ours: plain records
    for i in range(records):
        producer.produce(clicks, key=f"user-{i % 31}", value=f"click-{i} /page/{i % 7}")
    producer.flush()

    # --8<-- [start:bridge]
    config = BridgeConfig(input_topic=clicks, target_topic=guaranteed, instance_id=f"{ns.name}-bridge")
    with (
        Acker(settings, ns, AckerConfig(instance_id=f"{ns.name}-acker")).run_in_background(),
        Task(settings, ns, [guaranteed, f"{guaranteed}.replay"], f"{ns.name}.count", count).run_in_background(),
        Bridge(settings, ns, config).run_in_background(),  # clicks -> clicks.guaranteed
    ):
        wait_for_outcomes(tail, records)
    # --8<-- [end:bridge]
    return report(tail, sent, counted, records=records)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    with namespace(args, "bridge", {"clicks.guaranteed": 4}) as (settings, ns, tail):
        create_topics(settings.bootstrap_servers, {f"{ns.name}.clicks": 3})
        return run(settings, ns, args.records, tail)


if __name__ == "__main__":
    sys.exit(main())
