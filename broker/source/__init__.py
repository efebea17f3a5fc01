"""The source: where a record enters the guarantee (docs/design.md §8).

- ``client``: ``Source`` - the persist record, then the data record, in send order;
- ``sending``: the ids and the encoded persist records of a batch, and its two producers;
- ``placement``: a key's partition in its data topic and in the ledger;
- ``backpressure``: the window of pending origins (``SourceConfig.max_pending``).
"""

from broker.source.client import SendFailure, SendResult, Source, SourceConfig, Timeout

__all__ = ["SendFailure", "SendResult", "Source", "SourceConfig", "Timeout"]
