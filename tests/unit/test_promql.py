"""Label values never reach PromQL unescaped."""
from __future__ import annotations

import pytest

from core.promql import escape_label_value, label_matcher, render_query


def test_injection_attempt_stays_inside_the_string():
    """A model name crafted to close the matcher and append a query stays one string literal."""
    evil = 'ranker"} or vector(1) or {__name__="x'
    q = render_query('nv_inference_request_summary_us{model="$model"}', {"model": evil})
    assert q == 'nv_inference_request_summary_us{model="ranker\\"} or vector(1) or {__name__=\\"x"}'
    # exactly two unescaped quotes: the ones of the template
    unescaped = [i for i, c in enumerate(q) if c == '"' and q[i - 1] != "\\"]
    assert len(unescaped) == 2


@pytest.mark.parametrize(("raw", "escaped"), [
    ("a\\b", "a\\\\b"), ('a"b', 'a\\"b'), ("a\nb", "a\\nb"), ("plain", "plain")])
def test_escape_label_value(raw: str, escaped: str):
    """Backslash, quote and newline are escaped as PromQL (Go) strings require."""
    assert escape_label_value(raw) == escaped


def test_unknown_placeholder_and_bad_label_name_are_errors():
    """A placeholder without a value is an error, never an empty string; label names are checked."""
    with pytest.raises(KeyError):
        render_query('x{model="$model", ns="${namespace}"}', {"model": "m"})
    with pytest.raises(ValueError):
        label_matcher('model"}', "x")
    assert label_matcher("model", 'a"b') == 'model="a\\"b"'
