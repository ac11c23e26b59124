"""The demo's incident quantiles count only requests sent and answered within their span: a request
in flight when a model load begins is held by the load, which is the lab's deploy, not the defect."""
from __future__ import annotations

import math

from daemon.storage.records import EffectRow
from lab.load import RequestSample
from lab.scenarios.timeline import span_quantiles


def sample(sent: float, latency: float, status: int = 200) -> RequestSample:
    return RequestSample(sent_at_seconds=0.0, latency_seconds=latency, status=status, model_version="1",
                         sent_at_unix=sent)


def test_a_request_in_flight_at_the_end_of_the_span_is_left_out() -> None:
    fast = [sample(100.0 + i * 0.025, 0.005) for i in range(400)]
    held = sample(109.99, 1.5)  # sent 10 ms before the load began at 110.0, answered after it
    assert span_quantiles(fast + [held], 100.0, 110.0)["P99.9"] == 5.0
    # The same slow request answered inside the span counts: the span's own latency.
    inside = sample(105.0, 1.5)
    assert span_quantiles(fast + [inside], 100.0, 110.0)["P99.9"] == 1500.0


def test_requests_sent_before_the_span_or_not_answered_200_are_left_out() -> None:
    early = sample(99.0, 2.0)  # answered at 101.0, inside the span, but sent before it
    failed = sample(105.0, 0.9, status=503)
    assert math.isnan(span_quantiles([early, failed], 100.0, 110.0)["P50"])


def test_the_warm_load_span_comes_from_the_door_and_its_requests_are_told_apart() -> None:
    """keepWarm's load of v1 after the deploy holds the requests it finds in flight, like the deploy's
    own load: the demo leaves them out of the incident's quantiles and says how many were held."""
    from lab.scenarios.tail import overlaps, warm_load_spans

    def row(id_: int, writer: str, status: str, at: float) -> EffectRow:
        return EffectRow(id_, at, writer, "default/ranker", "triton.load", status, "", {}, None, None)

    effects = [
        row(1, "warm", "intent", 200.0),
        row(2, "warm", "done", 202.5),
        row(3, "executor", "intent", 230.0),  # the rollback: not warm
        row(4, "executor", "done", 230.01),
        row(5, "warm", "intent", 300.0),  # no result yet: no span
    ]
    spans = warm_load_spans(effects)
    assert spans == [(200.0, 202.5)]
    assert overlaps(sample(199.0, 1.5), spans)  # in flight when the load began
    assert overlaps(sample(201.0, 0.005), spans)  # sent during it
    assert not overlaps(sample(199.0, 0.5), spans)  # answered before it began
    assert not overlaps(sample(202.6, 0.005), spans)  # sent after it ended
