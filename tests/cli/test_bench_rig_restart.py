"""The bench's OpenBao rig killed and started again (`--store-restart-every`): the calls the
killed server answered are still counted (from its log, after the kill), and the event loop the
forwarder runs on is not held meanwhile. With a log this small the count is quick either way;
the hold it avoids is a busy run's: ~1 s of parsing after two minutes of a soak, during which
every request the forwarder carried waited."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from devkit.rigs import OpenBaoRig


async def login_and_read(rig: OpenBaoRig, session: aiohttp.ClientSession) -> None:
    assert rig.forwarder is not None
    url = rig.forwarder.url
    jwt = rig.tokens("sa-0")["vault"]
    async with session.post(f"{url}/v1/auth/jwt/login", json={"role": "bench", "jwt": jwt}) as r:
        token = (await r.json())["auth"]["client_token"]
    for i in range(2):
        path = f"{url}/v1/secret/data/bench/s{i}"
        async with session.get(path, headers={"X-Vault-Token": token}) as r:
            assert r.status == 200


async def test_a_restart_keeps_the_killed_servers_calls_and_the_loop_free(tmp_path: Path) -> None:
    rig = OpenBaoRig(tmp_path / "openbao", objects=2, identities=1, error_rate=0.0)
    await rig.start()
    try:
        async with aiohttp.ClientSession() as session:
            await login_and_read(rig, session)
            gaps: list[float] = []

            async def tick() -> None:
                last = time.monotonic()
                while True:
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            ticker = asyncio.create_task(tick())
            await rig.restart(0.1)
            ticker.cancel()
            assert rig.restarts == 1
            assert max(gaps) < 0.5  # the kill, the wait and the count all off the loop
            await login_and_read(rig, session)
        assert rig.store_calls() == {"logins": 2, "reads": 4}
    finally:
        await rig.stop()
