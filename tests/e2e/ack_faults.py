"""Faults between a micro-batch's outputs and its acks, injected by a test's subclass of
``Acking`` - the production class has no hook for them."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

from broker.schemas import XorBatch
from spark_jobs.acking import Acking, BatchStats


class AckFault(enum.Enum):
    """Where ``FaultyAcking`` calls its ``inject``: an exception raised there fails the batch
    as a real one would (Spark runs it again after a restart from the checkpoint)."""

    BEFORE_ACKS = "before_acks"  # outputs written, decision recorded, no ack sent
    # Every ack produced and flushed: where ``Acking._send`` raises ``DeliveryError`` when the
    # producer reports a failed delivery (raise it here to have one).
    AFTER_ACKS = "after_acks"


class FaultyAcking(Acking):
    """``Acking`` that calls ``inject(point, batch_id)`` around the sending of a batch's acks."""

    def __init__(self, *args: Any, inject: Callable[[AckFault, int], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inject = inject
        self.batch_id = -1

    def process(self, batch: DataFrame, batch_id: int) -> BatchStats:
        self.batch_id = batch_id
        return super().process(batch, batch_id)

    def _send(self, batches: list[XorBatch]) -> None:
        self.inject(AckFault.BEFORE_ACKS, self.batch_id)
        super()._send(batches)
        self.inject(AckFault.AFTER_ACKS, self.batch_id)
