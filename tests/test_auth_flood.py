"""Basic auth under a password flood (issue 25, items 3 and 5; issue 41): the real scraper is
never starved, not even on its first check, from any address (a NAT's included), bcrypt work
is bounded per client and overall, failures are rate-limited, counted and remembered, and
unknown user names cost what known ones do."""

from __future__ import annotations

import asyncio
import base64
import statistics
import time

import bcrypt
import pytest

from exporter.web import basicauth
from exporter.web.basicauth import BasicAuth, Verdict
from tests.support import Clock

PASSWORD = b"s3cret"


def header(user: str, password: bytes) -> str:
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


def users(cost: int) -> dict[str, bytes]:
    return {"prometheus": bcrypt.hashpw(PASSWORD, bcrypt.gensalt(cost))}


@pytest.mark.slow
async def test_guesses_never_evict_the_scrapers_cached_success() -> None:
    auth, known = BasicAuth(), users(4)
    assert await auth.check(known, header("prometheus", PASSWORD), "10.0.0.1") is Verdict.OK
    assert auth.checks == 1
    for i in range(600):  # wrong guesses from 600 clients, far more than any cache holds
        peer = f"10.1.{i // 250}.{i % 250}"
        assert await auth.check(known, header("prometheus", b"guess%d" % i), peer) in (
            Verdict.DENIED,
            Verdict.RATE_LIMITED,
        )
    checks = auth.checks
    assert await auth.check(known, header("prometheus", PASSWORD), "10.0.0.1") is Verdict.OK
    assert auth.checks == checks, "the scraper's success was evicted: it paid bcrypt again"


async def test_failures_are_rate_limited_per_client_without_bcrypt() -> None:
    clock = Clock()
    auth, known = BasicAuth(clock=clock), users(4)
    verdicts = [
        await auth.check(known, header("prometheus", b"wrong%d" % i), "10.0.0.9") for i in range(5)
    ]
    assert verdicts == [Verdict.DENIED] * 3 + [Verdict.RATE_LIMITED] * 2
    assert auth.checks == 3
    wrong = header("prometheus", b"wrong0")
    assert await auth.check(known, wrong, "10.0.0.8") is Verdict.DENIED, "others unaffected"
    assert auth.checks == 3, "a guess already checked is answered from memory, no bcrypt"
    clock.now += basicauth.FAILURE_REFILL_SECONDS
    assert await auth.check(known, header("prometheus", b"wrong9"), "10.0.0.9") is Verdict.DENIED
    assert auth.checks == 4


async def test_guessers_behind_the_scrapers_address_leave_it_its_second_try() -> None:
    """One NAT: guessers spend the address's budget for new credentials; the scraper's first
    check is refused with them, its second (the same password again) has a budget and a
    lane of its own."""
    auth, known = BasicAuth(clock=Clock()), users(4)
    for i in range(5):
        await auth.check(known, header("prometheus", b"guess%d" % i), "192.0.2.1")
    right = header("prometheus", PASSWORD)
    assert await auth.check(known, right, "192.0.2.1") is Verdict.RATE_LIMITED
    assert await auth.check(known, right, "192.0.2.1") is Verdict.OK
    checks = auth.checks
    assert await auth.check(known, right, "192.0.2.1") is Verdict.OK
    assert auth.checks == checks, "verified once: never bcrypt again"


async def test_a_scrapers_second_try_goes_before_any_number_of_new_guesses() -> None:
    """250 guessing addresses fill the new credentials' lane; a scraper never seen before is
    refused once, then checked right after the check that is running, before every new
    guess waiting."""
    auth, known = BasicAuth(), users(4)
    right = header("prometheus", PASSWORD)
    done: list[str] = []

    def guess(i: int) -> asyncio.Future[Verdict]:
        future = asyncio.ensure_future(
            auth.check(known, header("prometheus", b"g%d" % i), f"10.4.{i // 250}.{i % 250}")
        )
        future.add_done_callback(lambda f: done.append(f.result().value))
        return future

    guesses = [guess(i) for i in range(250)]
    await asyncio.sleep(0)  # one runs, MAX_WAITING wait, the others are refused
    assert await auth.check(known, right, "10.9.0.1") is Verdict.RATE_LIMITED
    scraper = asyncio.ensure_future(auth.check(known, right, "10.9.0.1"))
    scraper.add_done_callback(lambda _: done.append("scraper"))
    await asyncio.gather(scraper, *guesses)
    assert scraper.result() is Verdict.OK
    refused = 250 - 1 - basicauth.MAX_WAITING
    assert done[refused : refused + 2] == ["denied", "scraper"], done[refused:]


@pytest.mark.slow
async def test_waiting_is_bounded_and_a_client_that_passed_goes_first() -> None:
    auth, slow = BasicAuth(), users(10)
    right = header("prometheus", PASSWORD)
    assert await auth.check(slow, right, "10.0.0.1") is Verdict.OK
    rotated = {"prometheus": bcrypt.hashpw(b"rotated", bcrypt.gensalt(10))}
    guesses = [
        asyncio.ensure_future(auth.check(slow, header("prometheus", b"x%d" % i), f"10.2.0.{i}"))
        for i in range(12)
    ]
    await asyncio.sleep(0)  # the guesses are in: one runs, MAX_WAITING wait
    done_order: list[str] = []
    scraper = asyncio.ensure_future(
        auth.check(rotated, header("prometheus", b"rotated"), "10.0.0.1")
    )
    scraper.add_done_callback(lambda _: done_order.append("scraper"))
    for g in guesses:
        g.add_done_callback(lambda f: done_order.append(f.result().value))
    await asyncio.gather(scraper, *guesses)
    assert scraper.result() is Verdict.OK
    refused = 12 - 1 - basicauth.MAX_WAITING
    assert [g.result() for g in guesses].count(Verdict.RATE_LIMITED) == refused
    assert auth.checks == 1 + 1 + basicauth.MAX_WAITING + 1
    # refused at once, then the running guess, then the scraper before the waiting ones
    assert done_order[refused : refused + 2] == ["denied", "scraper"], done_order


@pytest.mark.slow
async def test_unknown_users_cost_what_known_ones_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unknown names are checked against a hash at the users' highest cost: the same bcrypt
    work, so no user-name oracle (the dummy was cost 10: against cost-12 users an unknown
    name answered in a quarter of the time)."""
    checked: list[bytes] = []
    real = basicauth._checkpw

    def recording(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(basicauth, "_checkpw", recording)
    auth = BasicAuth()
    known = {"low": bcrypt.hashpw(b"x", bcrypt.gensalt(4)), **users(12)}
    took: dict[str, list[float]] = {"prometheus": [], "nobody": []}
    for i in range(4):  # interleaved: the machine's load falls on both alike
        for user, times in took.items():
            started = time.perf_counter()
            wrong = header(user, b"wrong%d" % i)  # a guess checked before is not checked again
            verdict = await auth.check(known, wrong, f"10.3.{i}.{len(user)}")
            assert verdict is Verdict.DENIED
            if i:  # the first unknown check also makes the dummy hash
                times.append(time.perf_counter() - started)
    assert {h[:7] for h in checked} == {b"$2b$12$"}, "every check at cost 12"
    ratio = statistics.median(took["nobody"]) / statistics.median(took["prometheus"])
    assert 0.6 < ratio < 1.7, took  # a cost-10 dummy: 0.25
