"""Outages as they happen (issue 21): a store that hangs, a store that answers late.

The fetcher is driven directly with a store that goes through `BackendEnv.retry` like every real
backend, so the per-attempt timeout, serve-stale and each caller's own deadline meet as in
`serve`. Time scales are tenths of a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from tenacity import wait_fixed

from devkit.testing import fetch_ctx, make_env
from provider.core import retrying
from provider.core.backend import BackendEnv
from provider.core.errors import BridgeError, DeadlineExceeded, StoreUnavailable
from provider.core.metrics import Metrics
from provider.core.model import (
    FetchContext,
    Fetched,
    Identity,
    Pod,
    SecretValue,
    StorePlan,
    identity_key,
)
from provider.mount.fetching import Fetcher
from provider.mount.reads import StoreRead

#: Latency under load: run alone after the parallel run (Makefile, `make test`).
pytestmark = pytest.mark.serial

PLAN: StorePlan[str, str] = StorePlan(backend="hang", store="s", objects=())
#: The test store has no flags of its own.
NO_OPTIONS: dict[str, Any] = {}


def who(namespace: str = "a", service_account: str = "app") -> Identity:
    scope = f"{namespace}/{service_account}"
    return Identity(key=identity_key("hang", "store", scope), subject=scope)


class HangingStore:
    """Reads through `env.retry`; while `hanging`, a call never answers; `delay` answers late;
    `hang_namespaces` hang only those namespaces' reads."""

    name = "hang"

    def __init__(self, env: BackendEnv[Any]) -> None:
        self.env = env
        self.hanging = False
        self.refusing = False
        self.hang_namespaces: set[str] = set()
        self.delay = 0.0
        self.value = b"v1"
        self.calls = 0
        self.inflight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.answers: list[Fetched] = []

    async def identify(self, plan: Any, pod: Pod) -> Identity:
        return who(pod.namespace, pod.service_account)

    async def fetch(
        self, plan: Any, identity: Identity, refs: Sequence[str], ctx: FetchContext
    ) -> Mapping[str, Fetched]:
        namespace = identity.subject.split("/")[0]

        async def call() -> Mapping[str, Fetched]:
            self.calls += 1
            if self.refusing:
                raise StoreUnavailable("hang store: connection refused")
            self.inflight[namespace] = self.inflight.get(namespace, 0) + 1
            self.peak[namespace] = max(self.peak.get(namespace, 0), self.inflight[namespace])
            try:
                if self.hanging or namespace in self.hang_namespaces:
                    await asyncio.Event().wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
            finally:
                self.inflight[namespace] -= 1
            return {ref: [SecretValue(self.value)] for ref in refs}

        if self.answers:
            answer = self.answers.pop(0)
            return {ref: answer for ref in refs}
        try:
            return await self.env.retry(call, ctx)
        except BridgeError as exc:
            return {ref: exc for ref in refs}

    async def close(self) -> None:
        return None


def rig(**fetcher: Any) -> tuple[Fetcher, HangingStore, Metrics]:
    timeout = fetcher.pop("store_call_timeout", 0.3)
    store = HangingStore(make_env("hang", NO_OPTIONS, store_call_timeout=timeout))
    metrics = Metrics()
    fetcher.setdefault("cache_ttl", 0)
    return Fetcher(metrics=metrics, **fetcher), store, metrics


async def test_a_hung_call_is_unavailable_after_the_store_call_timeout() -> None:
    env = make_env("hang", NO_OPTIONS, store_call_timeout=0.2)
    attempts: list[float] = []

    async def hang() -> None:
        attempts.append(time.monotonic())
        await asyncio.Event().wait()

    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"hang store did not answer within 0\.2s"):
        await env.retry(hang, fetch_ctx(1.5))  # retries may start until 0.5 s
    assert len(attempts) >= 2 and time.monotonic() - start < 1.2
    # Counted as an outage, not as throttling.
    assert env.metrics.retries.labels("hang", "unavailable")._value.get() == len(attempts) - 1


async def test_an_attempt_ends_before_the_deadline_it_runs_under() -> None:
    env = make_env("hang", NO_OPTIONS, store_call_timeout=30)

    async def hang() -> None:
        await asyncio.Event().wait()

    start = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await env.retry(hang, fetch_ctx(0.6))
    assert time.monotonic() - start < 0.6


async def test_hung_store_serves_stale_within_the_stale_wait_with_one_refresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fetcher, store, metrics = rig(serve_stale_max_age=60, serve_stale_wait=0.3)
    first = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(5))
    assert first["r"][0].content == b"v1"  # type: ignore[index]
    store.hanging, store.value = True, b"v2"
    calls = store.calls
    start = time.monotonic()
    results = await asyncio.gather(
        *(fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(5)) for _ in range(20))
    )
    assert time.monotonic() - start < 0.6
    assert {r["r"][0].content for r in results} == {b"v1"}  # type: ignore[index]
    assert metrics.cache_events.labels("stale", "served")._value.get() == 20
    assert store.calls == calls + 1  # one refresh for twenty mounts
    served = [r for r in caplog.records if "serving the last good value" in r.getMessage()]
    assert len(served) == 1
    # The refresh goes on in the background: once the store answers, mounts see the new value.
    store.hanging = False
    await asyncio.sleep(0.5)
    again = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(5))
    assert again["r"][0].content == b"v2"  # type: ignore[index]
    await fetcher.close()


async def test_a_waiting_mount_holds_one_wait_for_all_its_objects() -> None:
    # An outage keeps every mount of its first seconds waiting at once, and RSS keeps the
    # high-water mark of that: a mount of twenty objects waits as one task, not one per object,
    # and each object is still answered at its own stop.
    fetcher, store, _ = rig(serve_stale_max_age=60, serve_stale_wait=0.3)
    refs = [f"r{i}" for i in range(20)]
    await fetcher.fetch(
        StoreRead(store, PLAN, who()), refs[:10], fetch_ctx(5)
    )  # stale copies of half
    store.hanging = True
    before = asyncio.all_tasks()
    start = time.monotonic()
    mount = asyncio.create_task(fetcher.fetch(StoreRead(store, PLAN, who()), refs, fetch_ctx(0.9)))
    await asyncio.sleep(0.1)
    assert len(asyncio.all_tasks() - before) == 2  # the mount and the one load it started
    result = await mount
    assert 0.9 <= time.monotonic() - start < 1.5  # held by the objects without a stale copy
    assert all(result[r][0].content == b"v1" for r in refs[:10])  # type: ignore[index]
    assert all(isinstance(result[r], DeadlineExceeded) for r in refs[10:])
    await fetcher.close()


async def test_without_stale_a_mount_fails_at_its_own_deadline_naming_the_store() -> None:
    fetcher, store, _ = rig()
    store.hanging = True
    first = asyncio.create_task(fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(0.5)))
    await asyncio.sleep(0.2)
    start = time.monotonic()
    late = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(1.2))
    waited = time.monotonic() - start
    assert 1.1 <= waited < 1.5  # its own deadline, not the first caller's
    error = late["r"]
    assert isinstance(error, DeadlineExceeded)
    assert "hang store did not answer" in str(error) and "last attempt" in str(error)
    assert isinstance((await first)["r"], DeadlineExceeded)
    assert store.calls <= 5  # one load and its retries, joined by both callers
    await fetcher.close()


async def test_a_late_joiner_gets_the_answer_the_first_caller_gave_up_on() -> None:
    fetcher, store, _ = rig(store_call_timeout=5)
    store.delay = 0.8
    first = asyncio.create_task(fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(0.3)))
    await asyncio.sleep(0.1)
    late = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(3))
    assert late["r"][0].content == b"v1"  # type: ignore[index]
    assert isinstance((await first)["r"], DeadlineExceeded)
    assert store.calls == 1


async def test_a_load_that_ran_out_of_time_is_restarted_for_a_caller_with_time_left() -> None:
    fetcher, store, _ = rig()
    store.answers = [DeadlineExceeded("the earlier caller's budget ran out")]
    result = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(3))
    assert result["r"][0].content == b"v1"  # type: ignore[index]
    assert store.calls == 1  # the second load read it


async def test_a_load_without_waiters_is_cancelled_when_nothing_keeps_its_result() -> None:
    fetcher, store, _ = rig()
    store.hanging = True
    result = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(0.3))
    assert isinstance(result["r"], DeadlineExceeded)
    await asyncio.sleep(0.05)
    assert store.inflight == {"a": 0}  # cache and stale off: nobody could use the answer


async def test_refused_is_still_served_stale_at_once(caplog: pytest.LogCaptureFixture) -> None:
    fetcher, store, metrics = rig(serve_stale_max_age=60, serve_stale_wait=5)
    await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(5))
    store.answers = [StoreUnavailable("connection refused")]
    start = time.monotonic()
    result = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(5))
    assert time.monotonic() - start < 0.2
    assert result["r"][0].content == b"v1"  # type: ignore[index]
    assert metrics.cache_events.labels("stale", "served")._value.get() == 1
    assert any(r.levelno == logging.WARNING for r in caplog.records)


async def test_a_refusal_answers_the_mounts_waiting_and_joining_with_their_stale_copies(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store went down (it refuses; the load keeps retrying): the mount that started the load
    # before any refusal, and a mount joining after it, both get their stale copy at the
    # refusal rather than after --serve-stale-wait, and the load goes on refreshing for
    # everyone. Retries 0.5 s apart (the backoff is random): the load outlives the stale wait.
    monkeypatch.setattr(retrying, "_BACKOFF", wait_fixed(0.5))
    fetcher, store, metrics = rig(serve_stale_max_age=60, serve_stale_wait=2)
    await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(5))
    store.refusing = True
    calls = store.calls
    start = time.monotonic()
    first = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(5))
    assert time.monotonic() - start < 0.2  # not the 2 s stale wait
    assert first["r"][0].content == b"v1"  # type: ignore[index]
    assert first["r"][0].source == "stale"  # type: ignore[index]
    await asyncio.sleep(0.1)
    joined = time.monotonic()
    late = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(5))
    assert time.monotonic() - joined < 0.1
    assert late["r"][0].content == b"v1"  # type: ignore[index]
    assert store.calls == calls + 1  # the late mount joined the load: no read of its own
    assert metrics.cache_events.labels("stale", "served")._value.get() == 2  # per mount
    assert metrics.cache_events.labels("values", "coalesced")._value.get() == 1
    assert sum("serving the last good value" in r.getMessage() for r in caplog.records) == 1
    # The load retries on: once the store answers, the next mount is served the new value.
    store.refusing, store.value = False, b"v2"
    await asyncio.sleep(0.6)
    assert store.calls == calls + 2
    again = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(5))
    assert again["r"][0].content == b"v2"  # type: ignore[index]
    await fetcher.close()


async def test_a_refusal_answers_only_the_objects_with_stale_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Half of the mount's objects were read before (stale copies), half never: the store's
    # refusal settles the first half at once, the others get the refusal at a third of the
    # mount's deadline, as without serve-stale.
    monkeypatch.setattr(retrying, "_BACKOFF", wait_fixed(0.1))
    fetcher, store, _ = rig(serve_stale_max_age=60, serve_stale_wait=2)
    await fetcher.fetch(StoreRead(store, PLAN, who()), ["r0", "r1"], fetch_ctx(5))
    store.refusing = True
    start = time.monotonic()
    result = await fetcher.fetch(
        StoreRead(store, PLAN, who()), ["r0", "r1", "r2", "r3"], fetch_ctx(1.5)
    )
    assert 0.45 <= time.monotonic() - start < 0.9
    assert [result[r][0].content for r in ("r0", "r1")] == [b"v1", b"v1"]  # type: ignore[index]
    assert all(isinstance(result[r], StoreUnavailable) for r in ("r2", "r3"))
    await fetcher.close()


async def test_a_refusing_store_is_answered_unavailable_at_a_third_of_the_deadline() -> None:
    # The driver re-sends an UNAVAILABLE mount, so a store that refuses is reported
    # once a third of the deadline is spent; a silent one is waited for (test above).
    fetcher, store, _ = rig()
    store.refusing = True
    start = time.monotonic()
    result = await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(1.5))
    elapsed = time.monotonic() - start
    # At the third (0.5 s), unless the read gave up sooner: its jittered backoff between
    # MAX_ATTEMPTS refusals is random and, rarely, all its attempts fit before 0.45 s.
    assert elapsed < 0.8 and (elapsed >= 0.45 or store.calls == retrying.MAX_ATTEMPTS)
    assert isinstance(result["r"], StoreUnavailable) and "refused" in str(result["r"])


async def test_a_credential_load_cancelled_with_its_caller_is_redone_for_the_others() -> None:
    from provider.core.caching import ExpiringCache

    cache: ExpiringCache[str] = ExpiringCache()
    started = asyncio.Event()
    loads = 0

    async def login() -> tuple[str, float]:
        nonlocal loads
        loads += 1
        started.set()
        await asyncio.sleep(0.2)
        return f"token-{loads}", 60

    first = asyncio.create_task(cache.get_or_load("k", login))
    await started.wait()
    second = asyncio.create_task(cache.get_or_load("k", login))
    await asyncio.sleep(0.05)
    first.cancel()  # the mount that started the login went away
    assert await second == "token-2"  # the one still waiting logs in itself, not cancelled


class RaisingStore:
    """A store whose whole fetch raises (a refused login) after every caller joined it."""

    name = "hang"

    async def identify(self, plan: Any, pod: Pod) -> Identity:
        return who(pod.namespace, pod.service_account)

    async def fetch(
        self, plan: Any, identity: Identity, refs: Sequence[str], ctx: FetchContext
    ) -> Mapping[str, Fetched]:
        await asyncio.sleep(0.05)
        raise StoreUnavailable("hang store: login refused")

    async def close(self) -> None:
        return None


async def test_callers_of_a_load_that_raised_do_not_collect_each_others_frames() -> None:
    """Every mount joined to the load gets the same exception object; each raise must not add
    its frames to one shared traceback (it kept every mount's frames alive)."""
    fetcher = Fetcher(cache_ttl=0, metrics=Metrics())
    store = RaisingStore()

    async def mount() -> StoreUnavailable:
        with pytest.raises(StoreUnavailable, match="login refused") as raised:
            await fetcher.fetch(StoreRead(store, PLAN, who()), ["r"], fetch_ctx(5))
        return raised.value

    errors = await asyncio.gather(*(mount() for _ in range(50)))
    assert len({id(error) for error in errors}) == 1  # shared, as single-flight shares it
    frames = []
    tb = errors[0].__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert len(frames) < 10, frames  # was 2 per joined mount: 102 entries
    assert "fetch" in frames  # where the load raised is still there to read
