"""The polite HTTP client: rate limits, retries (429 + Retry-After, 5xx, timeouts, truncation),
size limits, URL safety, redirects and the User-Agent, against real HTTP on 127.0.0.1."""
from __future__ import annotations

import email.utils
import time

import pytest
from fake_inat import FileServer

from curate.collect.http import (
    HttpError,
    PoliteClient,
    RateLimiter,
    RetryPolicy,
    TokenBucket,
    UnsafeURLError,
    check_url,
    parse_rate,
    parse_retry_after,
)

FAST = RetryPolicy(max_attempts=4, backoff_base=0.01, backoff_max=0.05, jitter=0.0)


def client(**kwargs) -> PoliteClient:
    kwargs.setdefault("api_limits", None)
    kwargs.setdefault("download_limits", None)
    kwargs.setdefault("byte_limits", None)
    kwargs.setdefault("retry", FAST)
    return PoliteClient(**kwargs)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_parse_rate() -> None:
    assert parse_rate("60/min,10000/day") == [(60.0, 60.0), (10000.0, 86400.0)]
    assert parse_rate("5/s") == [(5.0, 1.0)]
    assert parse_rate("2/5min") == [(2.0, 300.0)]
    assert parse_rate("none") == [] and parse_rate(None) == []
    assert parse_rate("5GB/hour", bytes_=True) == [(5e9, 3600.0)]
    with pytest.raises(ValueError, match="60/min"):
        parse_rate("sixty per minute")
    with pytest.raises(ValueError, match="size unit"):
        parse_rate("5GB/hour")


def test_token_bucket_enforces_both_windows() -> None:
    clock = FakeClock()
    limiter = RateLimiter("60/min,100/day", clock=clock, sleep=clock.sleep)
    for _ in range(60):  # the burst of the per-minute bucket is free
        limiter.acquire()
    assert clock.now == 0.0
    limiter.acquire()  # the 61st waits for one token: 1 s
    assert clock.now == pytest.approx(1.0)
    for _ in range(39):  # 100 in total: the day bucket is empty now
        limiter.acquire()
    start = clock.now
    limiter.acquire()  # next token of the day bucket: 86400 / 100 s after its debt began
    assert clock.now - start == pytest.approx(864.0, rel=0.05)


def test_limiter_pause_and_charge() -> None:
    clock = FakeClock()
    limiter = RateLimiter("10/s", clock=clock, sleep=clock.sleep)
    limiter.pause(2.5)
    limiter.acquire()
    assert clock.now == pytest.approx(2.5)
    volume = RateLimiter("1000/s", clock=clock, sleep=clock.sleep, bytes_=True)
    volume.charge(3000)  # a 3000-byte download: 2 s of debt
    volume.acquire(0)
    assert clock.now == pytest.approx(4.5)
    bucket = TokenBucket(5, 1.0, clock)
    assert bucket.reserve(5) == 0.0 and bucket.reserve(1) == pytest.approx(0.2)


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= parse_retry_after(when) <= 31
    assert parse_retry_after(email.utils.formatdate(time.time() - 30, usegmt=True)) == 0.0


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/x", "javascript:alert(1)", "//host/x",
                                 "http://user:pw@example.org/x", "http:///nohost", "http://a b/", 42, ""])
def test_unsafe_urls_are_refused(url) -> None:
    with pytest.raises(UnsafeURLError):
        check_url(url)


def test_allowed_hosts() -> None:
    assert check_url("https://static.inaturalist.org/photos/1/medium.jpg", {"static.inaturalist.org"})
    assert check_url("https://farm3.staticflickr.com/x.jpg", {"*.staticflickr.com"})
    assert check_url("http://127.0.0.1:8080/x", {"127.0.0.1:8080"})
    with pytest.raises(UnsafeURLError, match="not an allowed download host"):
        check_url("http://169.254.169.254/latest/meta-data", {"static.inaturalist.org"})
    with pytest.raises(UnsafeURLError):
        check_url("http://127.0.0.1:9999/x", {"127.0.0.1:8080"})


def test_json_retries_and_user_agent() -> None:
    files = {"/a.json": b'{"results": [1, 2]}', "/b.json": b'{"ok": true}', "/c.json": b'{"x": 1}'}
    faults = {"/a.json": "500_once", "/b.json": "429_once", "/c.json": "truncate_once"}
    with FileServer(files, faults) as server, client(contact="me@example.org") as http:
        assert http.get_json(server.url + "/a.json") == {"results": [1, 2]}
        assert http.get_json(server.url + "/b.json") == {"ok": True}
        assert http.get_json(server.url + "/c.json") == {"x": 1}
        assert server.requests["/a.json"] == 2 and server.requests["/b.json"] == 2
        assert server.requests["/c.json"] == 2
        assert http.stats.retries == 3 and http.stats.throttled == 1
        agent = server.headers[0]["User-Agent"]
        assert agent.startswith("curate/") and "me@example.org" in agent


def test_retry_after_is_honoured() -> None:
    with FileServer({"/x": b"{}"}, {"/x": "429_once"}, retry_after="1") as server, client() as http:
        start = time.monotonic()
        http.get_json(server.url + "/x")
        assert time.monotonic() - start >= 0.95  # waited the server's 1 s, not the 0.01 s backoff


def test_retry_after_beyond_the_cap_fails_with_advice() -> None:
    with FileServer({"/x": b"{}"}, {"/x": "429_always"}, retry_after="7200") as server, client() as http:
        with pytest.raises(HttpError, match="run the same command again later") as info:
            http.get_json(server.url + "/x")
        assert info.value.retryable and info.value.status == 429


def test_timeout_is_retried() -> None:
    with FileServer({"/x": b"{}"}, {"/x": "slow_once"}, slow_seconds=1.0) as server, \
            client(timeout=(2.0, 0.3)) as http:
        assert http.get_json(server.url + "/x") == {}
        assert server.requests["/x"] == 2


def test_permanent_errors_are_not_retried() -> None:
    with FileServer({"/x": b"{}", "/big": b"x" * 5000, "/bad": b"<html>"}) as server, \
            client(max_json_bytes=1000) as http:
        with pytest.raises(HttpError) as info:
            http.get_json(server.url + "/missing")
        assert info.value.status == 404 and not info.value.retryable
        assert server.requests["/missing"] == 1
        with pytest.raises(HttpError, match="over the limit") as info:
            http.get_json(server.url + "/big")
        assert info.value.code == "too_large"
        with pytest.raises(HttpError, match="not JSON"):
            http.get_json(server.url + "/bad")


def test_persistent_5xx_gives_up_as_retryable() -> None:
    with FileServer({"/x": b"{}"}, {"/x": "500_always"}) as server, client() as http:
        with pytest.raises(HttpError, match="after 4 attempts") as info:
            http.get_json(server.url + "/x")
        assert info.value.retryable and server.requests["/x"] == 4


def test_download_hosts_redirects_and_size() -> None:
    with FileServer({"/img": b"\x89PNG" + b"0" * 100, "/big": b"1" * 3000},
                    redirects={"/hop": "/img", "/away": "http://169.254.169.254/x"}) as server:
        host = "127.0.0.1"
        with client(allowed_download_hosts={host}, max_download_bytes=2000) as http:
            assert http.download(server.url + "/img").startswith(b"\x89PNG")
            assert http.download(server.url + "/hop").startswith(b"\x89PNG")  # redirect within allowed hosts
            with pytest.raises(HttpError, match="refused URL") as info:
                http.download(server.url + "/away")
            assert info.value.code == "unsafe_redirect"
            with pytest.raises(HttpError) as info:
                http.download(server.url + "/big")
            assert info.value.code == "too_large"
            assert http.stats.downloads >= 3
        with client(allowed_download_hosts={"static.inaturalist.org"}) as http:
            with pytest.raises(UnsafeURLError):
                http.download(server.url + "/img")


def test_download_byte_budget_waits() -> None:
    clock = FakeClock()
    budget = RateLimiter("1000/s", clock=clock, sleep=clock.sleep, bytes_=True)
    with FileServer({"/x": b"y" * 3000}) as server, client(byte_limits=budget) as http:
        http.download(server.url + "/x")  # 3000 bytes against a 1000 B/s budget
        http.download(server.url + "/x")  # must first pay 2 s of debt
        assert clock.now == pytest.approx(2.0, abs=0.1)
