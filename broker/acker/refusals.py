"""Outputs the broker refuses for good, remembered so the acker decides differently.

A replay record larger than its replay topic's ``max.message.bytes``, or one to a topic that
no longer exists, fails the transaction every time: abort, rewind, the same decision, the same
failure - forever, with everything else of those commits stalled behind it. So the commit
attaches a delivery callback to every replay, DLQ and quarantine record and remembers, by the
record's *subject* (the failed srid it decides, or the input position of quarantined input),
what the broker refused:

- a refused replay (the ``<topic>.replay`` or the new ``ns.persist`` record): after the
  rewind the srid is dead-lettered instead, the reason saying which topic refused what;
- a refused dead letter: written again without its value, then without key, value, history
  and original headers; if even that is refused, the acker stops (``ns.dlq`` is broken).

Only errors that repeat are remembered: unknown topic or partition, authorization, and the
record-level ones (size, invalid record, policy). Kafka refuses a whole produce request
(all records of one partition batched together) for one record too large, and a batch can
be too large although each of its records fits, so a record-level refusal counts only for a
record that travelled ALONE: the first time it is only suspected and produced alone in the
next attempts (``alone``). Everything else (timeouts, purges after another failure) is
transient: the rewind tries again.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, Message

from broker.acker.replay import Outgoing, Subject, stripped
from broker.errors import ReplayBrokerError
from broker.kafka_errors import Meaning, means

MAX_DLQ_LEVEL = 2  # 1: without the value; 2: without key, value, history, original headers


class Refusals:
    def __init__(self, dlq_topic: str) -> None:
        self.dlq_topic = dlq_topic
        self.replay: dict[Subject, str] = {}  # subject -> why its replay cannot be written
        self.dlq: dict[Subject, tuple[int, str]] = {}  # subject -> (what to drop, why)
        self.alone: set[Subject] = set()  # suspects: produced alone until settled
        self.unknown_topics: set[str] = set()  # to look up again
        self.noted: list[str] = []  # refusals for good since the last take_noted()
        self.suspected = 0

    def delivered(self, rec: Outgoing, alone: bool, err: KafkaError | None, _msg: Message | None) -> None:
        """Delivery callback of an output record."""
        if err is not None:
            self.refuse(rec, err, alone)

    def refuse(self, rec: Outgoing, err: KafkaError, alone: bool) -> bool:
        """Remember a refusal of ``rec``; True when it is for good (it will not be written)."""
        subject = rec.subject
        if subject is None:
            return False
        # Every record of the topic would be refused (TOPIC_REFUSED, UNKNOWN_TOPIC): no need
        # to try it alone. The unknown ones also make the acker look the topic's partition
        # count up again.
        refused_record = means(err, Meaning.REFUSED_RECORD)
        if refused_record and not alone:
            self.alone.add(subject)
            self.suspected += 1
            return False
        if not refused_record and not means(err, Meaning.TOPIC_REFUSED | Meaning.UNKNOWN_TOPIC):
            return False  # transient: the next attempt may succeed
        if means(err, Meaning.UNKNOWN_TOPIC):
            self.unknown_topics.add(rec.topic)
        why = f"{rec.topic} rejected the record: {err.str()}"
        if rec.topic == self.dlq_topic:
            self.dlq[subject] = (self.dlq.get(subject, (0, ""))[0] + 1, why)
        else:
            self.replay[subject] = why
        self.noted.append(f"{subject}: {why}")
        return True

    def degrade(self, rec: Outgoing) -> Outgoing | None:
        """``rec`` as the DLQ will take it, or None when it needs no change. Raises
        ReplayBrokerError when the DLQ refused even the barest dead letter."""
        if rec.topic != self.dlq_topic or rec.subject not in self.dlq:
            return None
        level, why = self.dlq[rec.subject]
        if level > MAX_DLQ_LEVEL:
            raise ReplayBrokerError(f"{self.dlq_topic} refuses even a dead letter without key and value: {why}")
        return stripped(rec, level, why)

    def settle(self, records: list[Outgoing]) -> None:
        """Forget the subjects whose outputs were committed: they are decided."""
        for rec in records:
            if rec.subject is not None:
                self.replay.pop(rec.subject, None)
                self.dlq.pop(rec.subject, None)
                self.alone.discard(rec.subject)

    def take_noted(self) -> list[str]:
        noted, self.noted = self.noted, []
        return noted

    def take_unknown_topics(self) -> set[str]:
        topics, self.unknown_topics = self.unknown_topics, set()
        return topics
