"""The retry policy's own rules, where no public setting reaches them: Retry-After dates, the back-off cap.

Private on purpose: ``parse_retry_after`` is checked at a fixed clock (``now=``), which an HTTP test cannot
hold still, and failover's ``max_retry_wait`` (the cap on any one back-off) is not an engine setting, so only
``ModelFailover`` itself can be given a cap short enough to test.  Everything a user reaches (Retry-After in
every form through the client, waits under the engine's 30 s cap) is in ``test_faults_http.py``.
"""
from __future__ import annotations

import email.utils

import pytest
from backoff_support import RecordedBackoffs
from faultkit import MESSAGES
from http_support import provider_fixtures

from streamengine import ConfigError
from streamengine._calls.failover import ModelFailover
from streamengine._calls.strategies import make_call_strategy
from streamengine._clients.http.errors import parse_retry_after
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")
fp, client = provider_fixtures("openai", api_key="sk-test-policy")


def test_retry_after_http_dates_are_counted_from_the_clock():
    now = 1_700_000_000.0
    assert parse_retry_after({"Retry-After": email.utils.formatdate(now + 30, usegmt=True)}, now=now) == 30.0
    assert parse_retry_after({"Retry-After": email.utils.formatdate(now - 30, usegmt=True)}, now=now) == 0.0
    assert parse_retry_after({"Retry-After": email.utils.formatdate(now + 3 * 86400, usegmt=True)}, now=now) is None
    assert parse_retry_after({"Retry-After": "Thu, 01 Jan 1970 00:01:40 GMT"}, now=40.0) == 60.0
    assert parse_retry_after({"retry-after-ms": "nan", "retry-after": "2"}) == 2.0


CAPPED = [
    # headers, max_retry_wait, the wait failover asks for before the retry
    ({"Retry-After": "120"}, 5.0, 5.0),  # over the cap: waits the cap, as "a" is the last model left
    ({"Retry-After": "1e9"}, 0.2, 0.2),  # ignored, so exponential back-off from 0.5 s, itself capped
]


@pytest.mark.parametrize("headers, cap, wait", CAPPED, ids=[f"{h}-cap{c:g}" for h, c, _ in CAPPED])
def test_the_back_off_never_exceeds_the_cap(client, fp, headers, cap, wait):
    fp.add_turn(s.http_error(429, {"error": {"message": "rate limited"}}, headers=headers))
    fp.add_turn(s.text("answer"))
    waits = RecordedBackoffs()
    strategy = make_call_strategy(client, idle_timeout=5.0, completion_timeout=10.0)
    result = waits.call(ModelFailover(strategy, ["a"], max_retry_wait=cap), MESSAGES)
    assert waits.waits == [wait]
    assert (result.model, result.response.content, result.failovers) == ("a", "answer", 0)
    assert [(m, e.status_code) for m, e in result.attempts] == [("a", 429)]
    assert [r.json["model"] for r in fp.requests] == ["a", "a"]


@pytest.mark.parametrize("kwargs, message", [
    ({"max_retries": True}, "max_retries must be an integer"),
    ({"max_retry_wait": float("nan")}, "max_retry_wait must be a finite number of seconds >= 0"),
    ({"max_retry_wait": True}, "max_retry_wait must be a number of seconds >= 0"),
])
def test_the_policy_settings_follow_the_one_rule_for_counts_and_seconds(client, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ModelFailover(make_call_strategy(client), ["a"], **kwargs)
