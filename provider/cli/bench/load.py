"""The load itself: client processes that send pre-serialized MountRequests as raw bytes.

Each client is its own process (`multiprocessing`, spawn), so the bench's Python work never
competes with the server under test inside one interpreter, and the bytes are serialized once,
before the run: what a client does per call is one grpc.aio unary call with no (de)serializer.

Two shapes:
- closed loop: `concurrency` calls in flight, each sent when the previous one answered;
  latency from send to answer.
- open loop: calls sent on a constant schedule (`rate` per second, spread over the clients),
  whatever the server does; latency from the *scheduled* send time to the answer, so a stalled
  server shows its queueing instead of hiding it by slowing the client (no coordinated
  omission). The `rotation` scenario is an open loop over V volumes at V/I per second.

A warm-up of the same shape runs first on the same channel and is not recorded. Every client
starts its measured phase at the same monotonic instant (CLOCK_MONOTONIC is system-wide).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

MOUNT = "/v1alpha1.CSIDriverProvider/Mount"
VERSION = "/v1alpha1.CSIDriverProvider/Version"
#: Latencies are recorded in microseconds, from 1 µs to 10 minutes, 3 significant digits.
HIGHEST_US = 600 * 1_000_000


def histogram() -> HdrHistogram:
    return HdrHistogram(1, HIGHEST_US, 3)


@dataclass(frozen=True)
class Shape:
    mode: str  # "closed" or "open"
    concurrency: int = 16
    rate: float = 0.0  # calls per second, all clients together (open loop)
    mounts: int = 0  # 0: until `duration` ends
    duration: float = 0.0
    warmup: float = 0.0
    timeout: float = 120.0


@dataclass
class Outcome:
    """One client's record of the measured phase (picklable, merged by `merge`)."""

    histogram: bytes = b""
    errors: dict[str, int] = field(default_factory=dict)
    samples: dict[str, str] = field(default_factory=dict)  # one message per gRPC code
    #: Per call: seconds since the phase start (scheduled or sent), latency in seconds.
    times: array[float] = field(default_factory=lambda: array("d"))
    latencies: array[float] = field(default_factory=lambda: array("d"))
    #: Per failed call: seconds since the phase start when it failed, and its code.
    error_times: list[tuple[float, str]] = field(default_factory=list)
    seconds: float = 0.0


class _Recorder:
    def __init__(self, phase_start: float, measured: bool) -> None:
        self.phase_start = phase_start
        self.measured = measured
        self.hist = histogram()
        self.out = Outcome()

    def ok(self, origin: float, now: float) -> None:
        if self.measured:
            latency = now - origin
            self.hist.record_value(max(1, min(HIGHEST_US, int(latency * 1e6))))
            self.out.times.append(origin - self.phase_start)
            self.out.latencies.append(latency)

    def error(self, now: float, exc: grpc.aio.AioRpcError) -> None:
        """A failed call, at `now`: when it failed, not when it was sent — a mount sent just
        before a store outage that fails because of it is an outage's failure."""
        if self.measured:
            code = exc.code().name
            self.out.errors[code] = self.out.errors.get(code, 0) + 1
            self.out.samples.setdefault(code, str(exc.details() or "")[:300])
            self.out.error_times.append((now - self.phase_start, code))


Call = Callable[[bytes], Awaitable[Any]]


async def _closed(
    call: Call,
    reqs: list[bytes],
    rec: _Recorder,
    n: int,
    until: float,
    c: int,
    counter: Any,
    slot: int,
) -> None:
    state = {"sent": 0, "next": 0}

    async def one_worker() -> None:
        while (n <= 0 or state["sent"] < n) and time.monotonic() < until:
            state["sent"] += 1
            req = reqs[state["next"] % len(reqs)]
            state["next"] += 1
            start = time.monotonic()
            try:
                await call(req)
            except grpc.aio.AioRpcError as exc:
                rec.error(time.monotonic(), exc)
            else:
                rec.ok(start, time.monotonic())
            counter[slot] += 1

    await asyncio.gather(*(one_worker() for _ in range(max(1, c))))


async def _open(
    call: Call,
    reqs: list[bytes],
    rec: _Recorder,
    n: int,
    start: float,
    until: float,
    rate: float,
    index: int,
    clients: int,
    counter: Any,
    slot: int,
) -> None:
    """Send call k (of all clients together) at start + k/rate; this client sends the k with
    k % clients == index. Latency counts from that scheduled instant."""
    pending: set[asyncio.Task[None]] = set()

    async def one(req: bytes, scheduled: float) -> None:
        try:
            await call(req)
        except grpc.aio.AioRpcError as exc:
            rec.error(time.monotonic(), exc)
        else:
            rec.ok(scheduled, time.monotonic())
        counter[slot] += 1

    k = index
    if not rec.measured:
        # A warm-up that began before this client was up starts now, not with a burst.
        behind = int(max(0.0, time.monotonic() - start) * rate)
        k += behind - behind % clients
    while n <= 0 or k < n:
        scheduled = start + k / rate
        if scheduled >= until:
            break
        delay = scheduled - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(reqs[k % len(reqs)], scheduled))
        pending.add(task)
        task.add_done_callback(pending.discard)
        k += clients
    if pending:
        await asyncio.gather(*pending)


async def _phase(
    call: Call,
    reqs: list[bytes],
    shape: Shape,
    start: float,
    until: float,
    index: int,
    clients: int,
    measured: bool,
    counter: Any,
) -> Outcome:
    rec = _Recorder(start, measured)
    slot = index * 2 + (1 if measured else 0)
    if shape.mode == "open":
        n = shape.mounts if measured else 0
        await _open(call, reqs, rec, n, start, until, shape.rate, index, clients, counter, slot)
    else:
        share = shape.concurrency // clients + (1 if index < shape.concurrency % clients else 0)
        n = 0
        if measured and shape.mounts:
            n = shape.mounts // clients + (1 if index < shape.mounts % clients else 0)
        delay = start - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await _closed(call, reqs, rec, n, until, share, counter, slot)
    rec.out.histogram = rec.hist.encode() if rec.hist.get_total_count() else b""
    rec.out.seconds = time.monotonic() - start
    return rec.out


async def _client(
    socket: str,
    reqs: list[bytes],
    shape: Shape,
    begin: float,
    index: int,
    clients: int,
    counter: Any,
) -> Outcome:
    options = [
        ("grpc.default_authority", "localhost"),
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ]
    async with grpc.aio.insecure_channel(f"unix://{socket}", options=options) as channel:
        version = channel.unary_unary(VERSION, request_serializer=None, response_deserializer=None)
        await version(b"", timeout=30, wait_for_ready=True)
        mount = channel.unary_unary(MOUNT, request_serializer=None, response_deserializer=None)

        def call(req: bytes) -> Awaitable[Any]:
            answer: Awaitable[Any] = mount(req, timeout=shape.timeout)
            return answer

        if shape.warmup > 0:
            warm_start = begin - shape.warmup
            await _phase(call, reqs, shape, warm_start, begin, index, clients, False, counter)
        far = begin + (shape.duration if shape.duration > 0 else 10 * 365 * 86400)
        return await _phase(call, reqs, shape, begin, far, index, clients, True, counter)


def _child(
    socket: str,
    reqs: list[bytes],
    shape: Shape,
    begin: float,
    index: int,
    clients: int,
    counter: Any,
    conn: multiprocessing.connection.Connection,
) -> None:
    try:
        conn.send(asyncio.run(_client(socket, reqs, shape, begin, index, clients, counter)))
    except BaseException as exc:  # reported to the parent, which fails the run with it
        conn.send(RuntimeError(f"bench client {index}: {type(exc).__name__}: {exc}"))
    finally:
        conn.close()


@dataclass
class Clients:
    """Client processes running one phase against one socket; `done()` counts finished calls
    (measured and warm-up) for the progress line."""

    procs: list[Any]
    conns: list[multiprocessing.connection.Connection]
    counter: Any
    begin: float

    def done(self) -> tuple[int, int]:
        values = list(self.counter)
        return sum(values[0::2]), sum(values[1::2])

    def collect(self) -> list[Outcome]:
        outcomes = []
        for conn, proc in zip(self.conns, self.procs, strict=True):
            got = conn.recv()
            proc.join()
            if isinstance(got, Exception):
                raise got
            outcomes.append(got)
        return outcomes

    def stop(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


def start_clients(socket: str, reqs: list[bytes], shape: Shape, clients: int) -> Clients:
    """Start `clients` processes; the measured phase begins after their start-up and warm-up."""
    ctx = multiprocessing.get_context("spawn")
    counter = ctx.Array("q", clients * 2, lock=False)
    # Spawned interpreters import grpc in ~0.3-1 s; the warm-up is scheduled after that.
    begin = time.monotonic() + 1.5 + shape.warmup
    procs, conns = [], []
    for index in range(clients):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_child,
            args=(socket, reqs, shape, begin, index, clients, counter, child),
            daemon=True,
        )
        proc.start()
        child.close()
        procs.append(proc)
        conns.append(parent)
    return Clients(procs, conns, counter, begin)


def merge(outcomes: list[Outcome]) -> tuple[HdrHistogram, Outcome]:
    """One histogram and one record from every client's."""
    hist = histogram()
    total = Outcome()
    for out in outcomes:
        if out.histogram:
            hist.decode_and_add(out.histogram)
        for code, n in out.errors.items():
            total.errors[code] = total.errors.get(code, 0) + n
        for code, msg in out.samples.items():
            total.samples.setdefault(code, msg)
        total.times.extend(out.times)
        total.latencies.extend(out.latencies)
        total.error_times.extend(out.error_times)
        total.seconds = max(total.seconds, out.seconds)
    return hist, total
