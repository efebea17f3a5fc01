"""The acker: folds persist records and XOR events into the ledger, exactly once, and decides
completion, timeout, replay and dead-lettering (docs/design.md §5, §6).

- ``config``: ``AckerConfig``;
- ``state``: one ledger partition's table, counters and due outputs;
- ``changelog``: restore from ``ns.ledger``, warm and standby states;
- ``ingest``: persist records and XOR batches into the tables, bad input quarantined;
- ``payloads``: the payload cache and the persist reader used by replays;
- ``decisions``: timeouts and fail marks into replays and dead letters;
- ``lag``: how far the inputs have been read, which gates timeouts;
- ``commit``: the transaction;
- ``service``: ``Acker``, the loop and the group membership around all of it.
"""

from broker.acker.config import AckerConfig, default_instance_id
from broker.acker.service import Acker
from broker.acker.state import COUNTERS, PartitionState

__all__ = ["COUNTERS", "Acker", "AckerConfig", "PartitionState", "default_instance_id"]
