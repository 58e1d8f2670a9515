"""A polite HTTP client for collectors: own rate limits, retries with backoff, size limits.

Why our own client (and not pyinaturalist's session): pyinaturalist copies its base URL at
import and mounts its retry adapter for ``https://`` only, so a collector that must run
against a loopback stand-in owns its base URL and its 429/5xx handling (ENVIRONMENT.md).

What it does:
- **Rate limits** as token buckets (:class:`RateLimiter`): API calls default to 60/minute and
  10,000/day (what iNaturalist asks of clients); downloads have their own request budget and a
  byte budget (iNaturalist asks for at most 5 GB/hour and 24 GB/day of media). A 429 pauses
  every thread sharing the limiter, not only the request that got it.
- **Retries** on 429 (honouring ``Retry-After``, seconds or an HTTP date), 5xx (500, 502, 503,
  504), timeouts, dropped connections and bodies shorter than their ``Content-Length``, with
  exponential backoff and jitter: wait = min(base * 2**(attempt-1), cap) * (1 + U(0, jitter)).
  No network is said at once: a host name that does not resolve fails the call without a
  retry (code ``unresolved_host``), a refused connection after at most
  :data:`REFUSED_ATTEMPTS` quick tries (``connection_refused``).
  A ``Retry-After`` longer than ``max_retry_after`` is not slept through: the call fails with a
  message saying when to re-run (every collector resumes).
- **Safety**: only ``http``/``https`` URLs without credentials; downloads optionally restricted
  to an allow-list of hosts (redirects are followed by hand, at most 5, each target checked);
  JSON bodies and downloads have size limits, checked against ``Content-Length`` and while
  streaming.
- A descriptive ``User-Agent`` naming curate, its version and (optionally) a contact.
- Thread-safe: one ``requests.Session`` per thread; bounded concurrency is the caller's
  thread pool (see :mod:`curate.collect.engine`).
"""
from __future__ import annotations

import email.utils
import json
import logging
import math
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
import urllib3

from curate import __version__

log = logging.getLogger(__name__)

#: iNaturalist's published limits for API clients: 60 requests/minute, 10,000/day.
DEFAULT_API_LIMITS = "60/min,10000/day"
#: Photo downloads: a request budget and a byte budget (iNaturalist: <= 5 GB/h, 24 GB/day).
DEFAULT_DOWNLOAD_LIMITS = "10/s"
DEFAULT_BYTE_LIMITS = "5GB/hour,24GB/day"
DEFAULT_TIMEOUT = (10.0, 60.0)
MAX_JSON_BYTES = 32 * 1024 * 1024
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024
MAX_REDIRECTS = 5
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: A refused connection (nothing listens there) is tried at most this many times, at most
#: REFUSED_BACKOFF seconds apart (a server restarting gets a moment, an absent one no minutes).
REFUSED_ATTEMPTS = 3
REFUSED_BACKOFF = 0.5

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
          "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}
_SIZES = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def default_user_agent(contact: str | None = None) -> str:
    """``curate/<version> (CounterAnimal-style benchmark collector[; contact: <contact>]) python-requests/<v>``.

    iNaturalist asks API clients to say who they are; pass ``contact`` (an e-mail or URL).
    """
    who = f"; contact: {contact}" if contact else ""
    return f"curate/{__version__} (CounterAnimal-style benchmark collector{who}) python-requests/{requests.__version__}"


class UnsafeURLError(ValueError):
    """A URL that curate refuses to fetch (scheme, credentials, host not allowed)."""


class HttpError(RuntimeError):
    """A request that failed for good (after retries, or at once for a non-retryable status).

    ``status``: the HTTP status (None for network errors); ``retryable``: whether running the
    job again later may succeed (429/5xx/timeouts/truncated bodies) or not (404, too large...);
    ``code``: a short reason code recorded in journals (``http_404``, ``timeout``, ``too_large``...).
    """

    def __init__(self, url: str, message: str, *, status: int | None = None, retryable: bool = False,
                 code: str | None = None) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.status = status
        self.retryable = retryable
        self.code = code or (f"http_{status}" if status else "network")


# ------------------------------------------------------------------------------------------
# URL checks
# ------------------------------------------------------------------------------------------


def host_of(url: str) -> str:
    """Lower-case host name of ``url`` ('' when none)."""
    return (urlsplit(url).hostname or "").lower()


def check_url(url: Any, allowed_hosts: Iterable[str] | None = None) -> str:
    """``url`` if curate may fetch it, else raise :class:`UnsafeURLError` saying why.

    Allowed: an ``http``/``https`` URL with a host and no user/password part, at most 4096
    characters, and (when ``allowed_hosts`` is given) whose host is in that list (entries are
    host names, optionally ``host:port``; ``*.example.org`` matches sub-domains).
    """
    if not isinstance(url, str) or not url:
        raise UnsafeURLError(f"not a URL: {url!r}")
    if len(url) > 4096 or any(ch in url for ch in "\r\n\t\x00 "):
        raise UnsafeURLError(f"refusing a malformed URL {url[:80]!r}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UnsafeURLError(f"refusing {url[:120]!r}: only http and https URLs are fetched")
    if not parts.hostname:
        raise UnsafeURLError(f"refusing {url[:120]!r}: no host")
    if parts.username or parts.password or "@" in parts.netloc:
        raise UnsafeURLError(f"refusing {url[:120]!r}: URLs with credentials are not fetched")
    if allowed_hosts is not None:
        host = parts.hostname.lower()
        try:
            port = parts.port
        except ValueError:
            raise UnsafeURLError(f"refusing {url[:120]!r}: bad port") from None
        for entry in allowed_hosts:
            entry = entry.lower().strip()
            if not entry:
                continue
            name, _, entry_port = entry.partition(":")
            if entry_port and str(port or "") != entry_port:
                continue
            if name == host or (name.startswith("*.") and host.endswith(name[1:])):
                return url
        raise UnsafeURLError(
            f"refusing {url[:120]!r}: host {host!r} is not an allowed download host "
            f"({', '.join(sorted(allowed_hosts)) or 'none'}); add it with --photo-host if you trust it")
    return url


# ------------------------------------------------------------------------------------------
# Rate limits
# ------------------------------------------------------------------------------------------


def parse_rate(text: str | None, *, bytes_: bool = False) -> list[tuple[float, float]]:
    """``"60/min,10000/day"`` -> ``[(60, 60.0), (10000, 86400.0)]``; ``"none"``/empty -> ``[]``.

    Each part is ``COUNT/UNIT`` with UNIT one of s, min, hour, day (also ``COUNT/5min``); with
    ``bytes_=True`` COUNT may carry a size suffix (``5GB/hour``, ``100MiB/min``).
    """
    if text is None:
        return []
    text = str(text).strip().lower()
    if text in ("", "none", "off", "unlimited", "0"):
        return []
    limits: list[tuple[float, float]] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*/\s*([0-9]*\.?[0-9]*)\s*([a-z]+)\s*", part)
        if not match:
            raise ValueError(f"cannot read the rate {part.strip()!r}; write e.g. 60/min, 10000/day"
                             + (" or 5GB/hour" if bytes_ else ""))
        amount, size_unit, period_n, unit = match.groups()
        if size_unit and not bytes_:
            raise ValueError(f"rate {part.strip()!r}: a request rate takes no size unit")
        if size_unit not in _SIZES:
            raise ValueError(f"rate {part.strip()!r}: unknown size unit {size_unit!r} (use KB, MB, GB, MiB, GiB)")
        unit = unit.rstrip("s") if unit not in _UNITS else unit
        if unit not in _UNITS:
            raise ValueError(f"rate {part.strip()!r}: unknown time unit {unit!r} (use s, min, hour, day)")
        count = float(amount) * _SIZES[size_unit]
        period = (float(period_n) if period_n else 1.0) * _UNITS[unit]
        if count <= 0 or period <= 0:
            raise ValueError(f"rate {part.strip()!r} must be positive")
        limits.append((count, period))
    return limits


class TokenBucket:
    """``capacity`` tokens, refilled continuously at ``capacity / period`` per second.

    Reservations may drive the level below zero (a debt): the caller then waits
    ``-level / rate`` seconds, so concurrent callers queue in order of reservation.
    """

    def __init__(self, capacity: float, period: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(capacity)
        self.rate = float(capacity) / float(period)
        self._clock = clock
        self._level = float(capacity)
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._last) * self.rate)
        self._last = now

    def reserve(self, amount: float) -> float:
        """Take ``amount`` tokens now; returns the seconds to wait before using them."""
        self._refill()
        self._level -= amount
        return 0.0 if self._level >= 0 else -self._level / self.rate

    def wait_time(self) -> float:
        """Seconds until the level is back to >= 0 (0 when not in debt)."""
        self._refill()
        return 0.0 if self._level >= 0 else -self._level / self.rate


class RateLimiter:
    """Several token buckets enforced together (e.g. 60/min and 10,000/day) plus a shared pause.

    ``acquire(n)`` blocks until ``n`` units fit every bucket; ``charge(n)`` takes units after the
    fact (bytes of a finished download); ``pause(s)`` makes every caller wait ``s`` seconds
    (a 429 from the server applies to all threads). No limits = no waiting.
    """

    def __init__(self, limits: Sequence[tuple[float, float]] | str | None = None, name: str = "requests", *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 bytes_: bool = False) -> None:
        if isinstance(limits, str) or limits is None:
            limits = parse_rate(limits, bytes_=bytes_)
        self.name = name
        self.limits = list(limits)
        self._clock = clock
        self._sleep = sleep
        self._buckets = [TokenBucket(c, p, clock) for c, p in self.limits]
        self._lock = threading.Lock()
        self._paused_until = 0.0
        self.waited = 0.0

    def describe(self) -> str:
        if not self.limits:
            return "unlimited"
        return ", ".join(f"{c:g}/{_period_name(p)}" for c, p in self.limits)

    def acquire(self, amount: float = 1.0) -> float:
        """Block until ``amount`` units are available in every bucket; returns the time waited."""
        with self._lock:
            wait = max(0.0, self._paused_until - self._clock())
            for bucket in self._buckets:
                wait = max(wait, bucket.reserve(amount) if amount else bucket.wait_time())
        if wait > 0:
            if wait > 30:
                log.warning("%s rate limit (%s): waiting %.0f s", self.name, self.describe(), wait)
            else:
                log.debug("%s rate limit: waiting %.2f s", self.name, wait)
            self._sleep(wait)
            with self._lock:
                self.waited += wait
        return wait

    def charge(self, amount: float) -> None:
        """Take ``amount`` units without waiting (the next :meth:`acquire` pays the debt)."""
        with self._lock:
            for bucket in self._buckets:
                bucket.reserve(amount)

    def pause(self, seconds: float) -> None:
        """Make every caller wait at least ``seconds`` from now."""
        with self._lock:
            self._paused_until = max(self._paused_until, self._clock() + max(0.0, seconds))


def _period_name(seconds: float) -> str:
    for unit, length in (("day", 86400.0), ("hour", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds == length:
            return unit
    return f"{seconds:g}s"


# ------------------------------------------------------------------------------------------
# The client
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How failing requests are retried (see the module docstring for the backoff formula)."""

    max_attempts: int = 6
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    jitter: float = 0.25
    #: A server asking to wait longer than this (seconds) fails the call instead of sleeping.
    max_retry_after: float = 900.0

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        wait = min(self.backoff_base * (2 ** (attempt - 1)), self.backoff_max)
        return wait * (1.0 + random.uniform(0.0, self.jitter))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return max(0.0, seconds)


@dataclass
class ClientStats:
    """What a client did: API calls, downloads, bytes, retries and seconds spent waiting."""

    api_calls: int = 0
    downloads: int = 0
    bytes: int = 0
    retries: int = 0
    throttled: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, value in counts.items():
                setattr(self, key, getattr(self, key) + value)

    def as_dict(self) -> dict[str, int]:
        return {"api_calls": self.api_calls, "downloads": self.downloads, "bytes": self.bytes,
                "retries": self.retries, "throttled": self.throttled}


class PoliteClient:
    """GET JSON and download files politely (rate limits, retries, size limits, safe URLs).

    Args:
        api_limits / download_limits: request rates (``"60/min,10000/day"``, ``"none"``, or a
            :class:`RateLimiter` to share one between clients).
        byte_limits: download volume rates (``"5GB/hour,24GB/day"``).
        allowed_download_hosts: hosts :meth:`download` may fetch from (None = any host).
        retry: the :class:`RetryPolicy`; timeout: (connect, read) seconds.
        user_agent / contact: the ``User-Agent`` header (default names curate and its version).
        sleep: injectable for tests.
    """

    def __init__(
        self,
        *,
        api_limits: str | RateLimiter | None = DEFAULT_API_LIMITS,
        download_limits: str | RateLimiter | None = DEFAULT_DOWNLOAD_LIMITS,
        byte_limits: str | RateLimiter | None = DEFAULT_BYTE_LIMITS,
        allowed_download_hosts: Iterable[str] | None = None,
        retry: RetryPolicy | None = None,
        timeout: tuple[float, float] | float = DEFAULT_TIMEOUT,
        user_agent: str | None = None,
        contact: str | None = None,
        max_json_bytes: int = MAX_JSON_BYTES,
        max_download_bytes: int = MAX_DOWNLOAD_BYTES,
        pool_size: int = 16,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api_limiter = api_limits if isinstance(api_limits, RateLimiter) else \
            RateLimiter(api_limits, "API", sleep=sleep)
        self.download_limiter = download_limits if isinstance(download_limits, RateLimiter) else \
            RateLimiter(download_limits, "download", sleep=sleep)
        self.byte_limiter = byte_limits if isinstance(byte_limits, RateLimiter) else \
            RateLimiter(byte_limits, "download bytes", sleep=sleep, bytes_=True)
        self.allowed_download_hosts = None if allowed_download_hosts is None else set(allowed_download_hosts)
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self.user_agent = user_agent or default_user_agent(contact)
        self.max_json_bytes = max_json_bytes
        self.max_download_bytes = max_download_bytes
        self.pool_size = pool_size
        self.stats = ClientStats()
        self._sleep = sleep
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._sessions_lock = threading.Lock()

    # -------------------------------------------------------------------- public
    def allow_host(self, host: str) -> None:
        """Add ``host`` to the download allow-list (no-op when downloads are unrestricted)."""
        if self.allowed_download_hosts is not None and host:
            self.allowed_download_hosts.add(host.lower())

    def get_json(self, url: str, params: Mapping[str, Any] | None = None) -> Any:
        """GET ``url`` with ``params`` under the API limits; the decoded JSON body."""
        check_url(url)
        data, _ = self._request(url, params, limiter=self.api_limiter, max_bytes=self.max_json_bytes,
                                allowed_hosts=None, kind="api")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise HttpError(url, f"the response is not JSON ({exc}); is the API URL right?", code="bad_json") from None

    def post_json(self, url: str, body: Any, *, headers: Mapping[str, str] | None = None) -> Any:
        """POST ``body`` as JSON to ``url`` under the API limits, with the same retries; the decoded
        JSON reply. ``headers`` (e.g. an ``Authorization`` header) are sent, never logged; redirects
        are not followed (a POST is not replayed elsewhere)."""
        check_url(url)
        data, _ = self._request(url, None, limiter=self.api_limiter, max_bytes=self.max_json_bytes,
                                allowed_hosts=None, kind="api", method="POST", json_body=body, headers=headers)
        try:
            return json.loads(data)
        except ValueError as exc:
            raise HttpError(url, f"the response is not JSON ({exc}); is the API URL right?", code="bad_json") from None

    def download(self, url: str) -> bytes:
        """The body of ``url`` (under the download and byte limits, host allow-list, size limit)."""
        check_url(url, self.allowed_download_hosts)
        self.byte_limiter.acquire(0)
        data, _ = self._request(url, None, limiter=self.download_limiter, max_bytes=self.max_download_bytes,
                                allowed_hosts=self.allowed_download_hosts, kind="download")
        self.byte_limiter.charge(len(data))
        self.stats.add(bytes=len(data))
        return data

    def close(self) -> None:
        with self._sessions_lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()

    def __enter__(self) -> PoliteClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -------------------------------------------------------------------- internals
    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=self.pool_size, max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            session.headers["User-Agent"] = self.user_agent
            session.headers["Accept-Encoding"] = "gzip, deflate"
            self._local.session = session
            with self._sessions_lock:
                self._sessions.append(session)
        return session

    def _request(self, url: str, params: Mapping[str, Any] | None, *, limiter: RateLimiter, max_bytes: int,
                 allowed_hosts: set[str] | None, kind: str, method: str = "GET", json_body: Any = None,
                 headers: Mapping[str, str] | None = None) -> tuple[bytes, requests.structures.CaseInsensitiveDict]:
        policy = self.retry
        last_problem = "no attempt made"
        refused = 0
        for attempt in range(1, policy.max_attempts + 1):
            limiter.acquire(1)
            if kind == "api":
                self.stats.add(api_calls=1)
            else:
                self.stats.add(downloads=1)
            wait: float | None = None
            try:
                if method == "GET":
                    response = self._get_following_redirects(url, params, allowed_hosts)
                else:
                    response = self._session().request(method, url, params=params, json=json_body, headers=headers,
                                                       timeout=self.timeout, stream=True, allow_redirects=False)
            except requests.Timeout as exc:
                last_problem, code = f"timed out ({type(exc).__name__})", "timeout"
            except requests.ConnectionError as exc:
                cause = connection_failure(exc)
                if cause == "unresolved":  # no use retrying: say so at once
                    raise HttpError(url, f"the host {host_of(url)!r} cannot be resolved (no network?); check the "
                                    "connection and the URL, then run the same command again (it resumes)",
                                    retryable=True, code="unresolved_host") from None
                if cause == "refused":
                    refused += 1
                    if refused >= REFUSED_ATTEMPTS or attempt == policy.max_attempts:
                        raise HttpError(url, f"{_netloc(url)} refused the connection (is the server running? no "
                                        "network?); run the same command again later (it resumes)",
                                        retryable=True, code="connection_refused") from None
                    wait = min(policy.backoff(attempt), REFUSED_BACKOFF)
                last_problem, code = f"connection failed ({_short(exc)})", "connection"
            else:
                with response:
                    status = response.status_code
                    if status == 429:
                        retry_after = parse_retry_after(response.headers.get("Retry-After"))
                        self.stats.add(throttled=1)
                        if retry_after is not None and retry_after > policy.max_retry_after:
                            raise HttpError(url, f"the server throttles us (429) and asks to wait {retry_after:.0f} s "
                                            f"(more than {policy.max_retry_after:.0f} s, a daily limit?); run the same "
                                            "command again later, it resumes where it stopped",
                                            status=429, retryable=True)
                        # honour Retry-After exactly; without one, back off exponentially
                        wait = retry_after if retry_after is not None else policy.backoff(attempt)
                        limiter.pause(wait)  # every thread sharing the limiter waits too
                        last_problem, code = f"HTTP 429 (Retry-After {response.headers.get('Retry-After')!r})", "http_429"
                    elif status in RETRY_STATUSES:
                        retry_after = parse_retry_after(response.headers.get("Retry-After"))
                        if retry_after is not None and retry_after <= policy.max_retry_after:
                            wait = max(retry_after, policy.backoff(attempt))
                        last_problem, code = f"HTTP {status}", f"http_{status}"
                    elif status >= 300:
                        raise HttpError(url, f"HTTP {status} {response.reason or ''}".rstrip()
                                        + _error_detail(response), status=status, retryable=False)
                    else:
                        try:
                            return self._read_body(url, response, max_bytes), response.headers
                        except _Truncated as exc:
                            last_problem, code = str(exc), "truncated"
            if attempt == policy.max_attempts:
                break
            wait = policy.backoff(attempt) if wait is None else wait
            self.stats.add(retries=1)
            log.info("%s %s: %s; retry %d/%d in %.1f s", method, _short_url(url), last_problem, attempt,
                     policy.max_attempts - 1, wait)
            self._sleep(wait)
        raise HttpError(url, f"{last_problem} after {policy.max_attempts} attempts; the server may be down or "
                        "throttling: run the same command again later (it resumes)",
                        status=int(code[5:]) if code.startswith("http_") else None, retryable=True, code=code)

    def _get_following_redirects(self, url: str, params: Mapping[str, Any] | None,
                                 allowed_hosts: set[str] | None) -> requests.Response:
        session = self._session()
        current, current_params = url, params
        for _ in range(MAX_REDIRECTS + 1):
            response = session.get(current, params=current_params, timeout=self.timeout, stream=True,
                                   allow_redirects=False)
            if response.status_code in (301, 302, 303, 307, 308) and response.headers.get("Location"):
                target = urljoin(response.url, response.headers["Location"])
                response.close()
                try:
                    check_url(target, allowed_hosts)
                except UnsafeURLError as exc:
                    raise HttpError(url, f"redirected to a refused URL: {exc}", status=response.status_code,
                                    code="unsafe_redirect") from None
                current, current_params = target, None
                continue
            return response
        raise HttpError(url, f"more than {MAX_REDIRECTS} redirects", code="redirect_loop")

    @staticmethod
    def _read_body(url: str, response: requests.Response, max_bytes: int) -> bytes:
        declared = response.headers.get("Content-Length")
        expected: int | None = None
        if declared is not None and response.headers.get("Content-Encoding") in (None, "", "identity"):
            try:
                expected = int(declared)
            except ValueError:
                expected = None
        if expected is not None and expected > max_bytes:
            raise HttpError(url, f"the body is {expected} bytes, over the limit of {max_bytes}", code="too_large")
        chunks: list[bytes] = []
        total = 0
        try:
            for chunk in response.iter_content(chunk_size=1 << 16):
                total += len(chunk)
                if total > max_bytes:
                    raise HttpError(url, f"the body exceeds the limit of {max_bytes} bytes", code="too_large")
                chunks.append(chunk)
        except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError,
                requests.ConnectionError, requests.Timeout) as exc:
            raise _Truncated(f"the body broke off after {total} bytes ({_short(exc)})") from None
        if expected is not None and total != expected:
            raise _Truncated(f"the body is {total} bytes but Content-Length says {expected}")
        return b"".join(chunks)


_NAME_RESOLUTION_ERRORS: tuple[type[BaseException], ...] = (socket.gaierror,) + tuple(
    t for t in (getattr(urllib3.exceptions, "NameResolutionError", None),) if t is not None)  # urllib3 >= 2


def connection_failure(exc: BaseException) -> str | None:
    """``"unresolved"`` when ``exc`` (a requests ConnectionError) comes from a host name that does
    not resolve (DNS failure, ``socket.gaierror``), ``"refused"`` when nothing listens at the
    address (``ConnectionRefusedError``), else None (a dropped or reset connection...)."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    refused = False
    while todo:
        item = todo.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, _NAME_RESOLUTION_ERRORS):
            return "unresolved"
        if isinstance(item, ConnectionRefusedError):
            refused = True
        todo += [item.__cause__, item.__context__, getattr(item, "reason", None), *item.args]
    return "refused" if refused else None


def _netloc(url: str) -> str:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.hostname}:{port}" if port else str(parts.hostname)


class _Truncated(Exception):
    """A body that ended early (retryable)."""


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 160 else text[:157] + "..."


def _short_url(url: str) -> str:
    return url if len(url) <= 120 else url[:117] + "..."


def _error_detail(response: requests.Response) -> str:
    try:
        text = response.raw.read(400, decode_content=True).decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - best effort
        return ""
    text = re.sub(r"\s+", " ", text)
    return f": {text[:200]}" if text else ""
