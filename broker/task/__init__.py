"""The task: a consume loop that runs a handler per input and acks each with one XOR event
(docs/design.md §4, §8).

- ``service``: ``Task``, the loop, the group and its rebalances, the commits;
- ``records``: ``TaskRecord`` and ``TaskContext`` - a handler's inputs and what it does with
  each - and how that becomes the input's event or fail mark;
- ``config``: ``TaskConfig``, ``TaskCounters``;
- ``acks``: the events and marks of a batch, into ``ns.acks`` (``TaskAcks``);
- ``outage``: a dependency that is down - its back-off and timing (``Outage``), the put-back,
  pauses, touches and beats (``OutageHold``);
- ``superseded``: a replay whose original completed late, acked as a leaf (``SupersededSkip``).
"""

from broker.task.config import TaskConfig, TaskCounters, without_replay_topics
from broker.task.records import BatchHandler, Handler, TaskContext, TaskRecord
from broker.task.service import Task

__all__ = ["BatchHandler", "Handler", "Task", "TaskConfig", "TaskContext", "TaskCounters", "TaskRecord",
           "without_replay_topics"]
