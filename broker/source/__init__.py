"""The source: where a record enters the guarantee (docs/design.md §8).

- ``client``: ``Source`` - the persist record, then the data record, in send order;
- ``config``: ``SourceConfig``, and the checks of a timeout and of a number of attempts;
- ``sending``: ``RecordSender``, the one send path - the ids, the persist and the data record;
- ``placement``: a key's partition in its data topic and in the ledger;
- ``backpressure``: the window of pending origins (``SourceConfig.max_pending``).
"""

from broker.source.client import SendFailure, SendResult, Source, SourceConfig, Timeout

__all__ = ["SendFailure", "SendResult", "Source", "SourceConfig", "Timeout"]
