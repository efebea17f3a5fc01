"""The pure part of the bench's request accounting (bench.requests): the broker's cumulative
counters between two samples, per 1 000 completed records, by API and by topic role."""

from __future__ import annotations

from broker.bench.requests import compare

NS = "bench-pipeline-1a2b3c4d"
RB = "kafka.network:type=RequestMetrics,name=RequestBytes,request="
BT = "kafka.server:type=BrokerTopicMetrics,name="


def _sample(produce: int, produce_mean: float, fetch: int, records: int, out_bytes: int,
            follower: int = 0) -> dict[str, float]:
    return {
        f"{RB}Produce:Count": produce, f"{RB}Produce:Mean": produce_mean,
        f"{RB}FetchConsumer:Count": fetch, f"{RB}FetchConsumer:Mean": 100.0,
        f"{RB}Fetch:Count": fetch + follower, f"{RB}FetchFollower:Count": follower,
        f"{RB}EndTxn:Count": produce // 10, f"{RB}EndTxn:Mean": 50.0,
        f"{BT}MessagesInPerSec:Count": records, f"{BT}BytesOutPerSec:Count": out_bytes,
        f"{BT}TotalProduceRequestsPerSec,topic={NS}.persist:Count": produce,
        f"{BT}MessagesInPerSec,topic={NS}.persist:Count": records,
        f"{BT}TotalFetchRequestsPerSec,topic={NS}.data.replay:Count": fetch,
    }


def test_requests_are_counted_per_thousand_records_by_api_and_topic() -> None:
    before = _sample(100, 1000.0, 50, 10_000, 0, follower=7)
    # 20 more produce requests of 3 000 B on average: (120 x 2 000 - 100 x 1 000) B in all
    after = _sample(120, 2000.0, 60, 14_000, 40_000, follower=70)
    out = compare(before, after, completed=2_000, namespace=NS)
    assert out["requests_per_1k"] == {"Produce": 10.0, "FetchConsumer": 5.0, "EndTxn": 1.0}
    assert out["total_per_1k"] == 16.0  # Fetch (consumer + follower) and FetchFollower left out
    assert out["produce"] == {"records_per_request": 200.0, "bytes_per_request": 7000.0}
    assert out["fetch"] == {"bytes_per_response": 4000.0}
    assert out["topics"]["persist"]["produce_requests_per_1k"] == 10.0
    assert out["topics"]["persist"]["records_in_per_record"] == 2.0
    assert out["topics"]["replay"]["fetch_requests_per_1k"] == 5.0


def test_nothing_requested_is_an_empty_table() -> None:
    same = _sample(5, 10.0, 5, 5, 5)
    out = compare(same, same, completed=1_000, namespace=NS)
    assert out["requests_per_1k"] == {} and out["total_per_1k"] == 0.0
    assert out["produce"]["records_per_request"] is None and out["fetch"]["bytes_per_response"] is None
