"""What the HTTP shell remembers per status URL follows the operations being polled, not every
operation that ever was (issue 38: about 0.5 KiB per ended operation stayed in two LRU caches
of 16,384 URLs each)."""

from __future__ import annotations

import tracemalloc

from daemon import http
from daemon.recent import RecentResults


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _churn(cache: RecentResults[str, str], clock: Clock, start: int, stop: int) -> None:
    """40 operations a second, each URL asked for three times over its first second; 50
    operations polled every second throughout."""
    for n in range(start, stop):
        if n % 40 == 0:
            clock.now += 1.0
            for live in range(50):
                cache.get(f"https://p.example/jobs/live-{live}")
        for _ in range(3):
            cache.get(f"https://p.example/jobs/{n:07d}")


def test_urls_no_longer_polled_are_let_go() -> None:
    """After 2,000 and after 12,000 ended operations, the same number in use: the memory held
    is the same within a few bytes per ended operation (an LRU of 16,384 would hold all 12,000)."""
    clock = Clock()
    cache: RecentResults[str, str] = RecentResults(
        str.upper, seconds=10.0, most=16_384, clock=clock
    )
    tracemalloc.start()
    try:
        _churn(cache, clock, 0, 2000)
        small, _ = tracemalloc.get_traced_memory()
        _churn(cache, clock, 2000, 12_000)
        large, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(cache) <= 50 + 40 * 21, len(cache)
    per_ended = (large - small) / 10_000
    assert per_ended < 10, f"{per_ended:.0f} bytes kept per ended operation"


def test_a_url_in_steady_use_is_parsed_once() -> None:
    clock = Clock()
    parsed: list[str] = []

    def parse(url: str) -> str:
        parsed.append(url)
        return url.upper()

    cache = RecentResults(parse, seconds=10.0, most=100, clock=clock)
    for second in range(1000):
        clock.now = float(second)
        assert cache.get("https://p.example/jobs/steady") == "HTTPS://P.EXAMPLE/JOBS/STEADY"
        cache.get(f"https://p.example/jobs/{second}")  # others come and go around it
    assert parsed.count("https://p.example/jobs/steady") == 1


def test_any_rate_of_new_urls_is_bounded() -> None:
    cache = RecentResults(str.upper, seconds=3600.0, most=1000, clock=Clock())
    for n in range(50_000):
        cache.get(f"https://p.example/jobs/{n}")
    assert len(cache) <= 2000


def test_the_http_shell_remembers_urls_this_way() -> None:
    """The status URL check and the origin, as ``fetch`` and ``call`` use them."""
    assert isinstance(http._url_refused, RecentResults)
    assert isinstance(http._origins, RecentResults)
    assert http._origin_of("https://P.example/jobs/1") == "https://p.example:443"
    url = "https://p.example/jobs/1"
    assert http._url_refused.get((url, "https://p.example:443", "/jobs/")) is None
    assert http._url_refused.get((url, "https://q.example:443", "/jobs/")) is not None
