"""A Kubernetes API server fake for the change feed: namespaced objects, list+watch, faults.

    async with serving(bookmark_interval=0.2) as (api, client):   # on 127.0.0.1
        await client.create(configmaps("ns"), {...})
        api.break_watches(); api.compact(); api.pause(); api.resume()

It speaks the real wire protocol for /api/v1/namespaces/{ns}/{configmaps,events} and
/apis/{coordination.k8s.io/v1/leases, discovery.k8s.io/v1/endpointslices} under a namespace:
create (409 AlreadyExists), get (404 NotFound), PUT (409 Conflict on a stale resourceVersion,
404 when absent), DELETE, list with an equality labelSelector (`a=b,c=d`) and the list's
resourceVersion, and watch (`watch=1`, `resourceVersion`, `allowWatchBookmarks`,
`timeoutSeconds`, `labelSelector`) served from a bounded history of events after the given
version, then live. A version older than the history gets an ERROR event with a 410 Status
inside a 200 stream, as the real server answers. One global resourceVersion counter; uid,
creationTimestamp and resourceVersion set by the server; a bearer token checked (401 Status);
names must be DNS-1123 subdomains, label keys and values valid, ConfigMap data at most 1 MiB
(422 Invalid, "[]: Too long: must have at most 1048576 bytes"), bodies at most 3 MiB (413).
An object that stops matching a watch's selector is sent as DELETED, one that starts as ADDED.

What a real API server does differently:
- watches and (since 1.31, consistent reads from cache) lists are served from a watch cache in
  front of etcd; resourceVersions are etcd revisions, opaque to clients and not contiguous
  per resource; resourceVersion="0" lists may be stale;
- history: etcd is compacted every ~5 minutes, the watch cache keeps a window of events (by
  count and ~75 s); a resume older than both is 410 "too old resource version";
- bookmarks come about once a minute (and just before a timeoutSeconds end), only when asked;
- it closes watches itself (timeoutSeconds is randomised up to twice --min-request-timeout,
  1800 s), drops watchers that fall behind, and spreads load through API Priority and
  Fairness (429 with Retry-After), none of which happens here except the timeout asked for;
- it authorises with RBAC per verb and resource, supports field selectors, set-based label
  selectors, server-side apply, PATCH, sendInitialEvents, and rejects far more invalid objects.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from devkit.ports import serve_app
from provider.core.kube import KubeClient

#: resource → (kind, apiVersion) of the collections served, by API group path.
KINDS = {
    ("api/v1", "configmaps"): ("ConfigMap", "v1"),
    ("api/v1", "events"): ("Event", "v1"),
    ("apis/coordination.k8s.io/v1", "leases"): ("Lease", "coordination.k8s.io/v1"),
    ("apis/discovery.k8s.io/v1", "endpointslices"): ("EndpointSlice", "discovery.k8s.io/v1"),
}
MAX_CONFIGMAP = 1024 * 1024
MAX_REQUEST = 3 * 1024 * 1024
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
Obj = dict[str, Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class _Event:
    version: int
    collection: str
    type: str
    obj: Obj
    old: Obj | None = None


@dataclass(eq=False)
class _Watcher:
    collection: str
    queue: asyncio.Queue[_Event | None] = field(default_factory=lambda: asyncio.Queue(1000))


class KubeApi:
    def __init__(
        self,
        *,
        token: str = "kubeapi-test-token",
        history: int = 1000,
        bookmark_interval: float = 60.0,
    ) -> None:
        self.token = token
        #: The bearer tokens accepted (a test adds one per client, and takes one away to cut
        #: a client off as a network partition would).
        self.tokens = {token}
        self.bookmark_interval = bookmark_interval
        self.url = ""
        #: Requests served, by verb (get, list, watch, create, update, delete).
        self.requests: collections.Counter[str] = collections.Counter()
        #: Events sent (bookmarks included), one entry per watch opened, in order.
        self.events_sent: list[int] = []
        self._version = 0
        self._objects: dict[str, dict[str, Obj]] = collections.defaultdict(dict)
        self._history: collections.deque[_Event] = collections.deque(maxlen=history)
        #: The newest version a watch can no longer resume after (older ones are gone).
        self._floor = 0
        self._watchers: set[_Watcher] = set()
        self._paused: asyncio.Event | None = None
        self._hang = False
        self._runner: web.AppRunner | None = None

    async def start(self) -> KubeApi:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_REQUEST)
        for root in ("/api/v1", "/apis/{group}/{gv}"):
            collection = root + "/namespaces/{ns}/{resource}"
            app.router.add_route("*", collection, self._collection)
            app.router.add_route("*", collection + "/{name}", self._object)
        self._runner, port = await serve_app(app)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        self.resume()
        self.break_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    # Faults.
    def break_watches(self) -> None:
        """End every open watch abruptly (no final chunk): clients see a broken stream."""
        for watcher in self._watchers:
            _offer(watcher, None)

    def compact(self) -> None:
        """Drop the event history (etcd's compaction): a watch resumed from a version older
        than the newest gets 410; one from the newest, or after a relist, goes on."""
        self._history.clear()
        self._floor = self._version

    def pause(self, *, hang: bool = False) -> None:
        """Every call answers 503 (or, with `hang`, is held unanswered) until `resume`; open
        watches break."""
        self._paused, self._hang = self._paused or asyncio.Event(), hang
        self.break_watches()

    def resume(self) -> None:
        if self._paused is not None:
            self._paused.set()
            self._paused = None

    # Direct access for tests.
    def object(self, collection: str, name: str) -> Obj | None:
        return self._objects[collection.rstrip("/")].get(name)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._paused is not None:
            if not self._hang:
                return _status(503, "ServiceUnavailable", "the server is paused")
            await self._paused.wait()
        given = request.headers.get("Authorization", "")
        if not given.startswith("Bearer ") or given.removeprefix("Bearer ") not in self.tokens:
            return _status(401, "Unauthorized", "Unauthorized")
        group = request.match_info.get("group")
        root = f"apis/{group}/{request.match_info['gv']}" if group else "api/v1"
        if (root, request.match_info["resource"]) not in KINDS:
            return _status(404, "NotFound", "the server could not find the requested resource")
        return await handler(request)

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        if request.method == "GET" and request.query.get("watch") in ("1", "true"):
            self.requests["watch"] += 1
            return await self._watch(request, path)
        if request.method == "GET":
            self.requests["list"] += 1
            return self._list(request, path)
        if request.method == "POST":
            self.requests["create"] += 1
            return self._create(request, path, await _body(request))
        return _status(405, "MethodNotAllowed", "the server does not allow this method")

    async def _object(self, request: web.Request) -> web.StreamResponse:
        path, name = request.path.rsplit("/", 1)
        objects = self._objects[path]
        current = objects.get(name)
        what = f'{request.match_info["resource"]} "{name}"'
        verb = {"GET": "get", "PUT": "update", "DELETE": "delete"}.get(request.method)
        if verb is None:
            return _status(405, "MethodNotAllowed", "the server does not allow this method")
        self.requests[verb] += 1
        if current is None:
            return _status(404, "NotFound", f"{what} not found")
        if verb == "get":
            return web.json_response(current)
        if verb == "delete":
            del objects[name]
            gone = _with_version(current, self._next())
            self._record(_Event(self._version, path, "DELETED", gone, current))
            return web.json_response({"kind": "Status", "status": "Success", "code": 200})
        body = await _body(request)
        given = (body.get("metadata") or {}).get("resourceVersion")
        if given and given != current["metadata"]["resourceVersion"]:
            return _status(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {what}: the object has been modified; "
                "please apply your changes to the latest version and try again",
            )
        if (body.get("metadata") or {}).get("name") != name:
            return _status(400, "BadRequest", "the name of the object does not match the URL")
        problem = _invalid(body, request.match_info["resource"])
        if problem:
            return _status(422, "Invalid", f"{what} is invalid: {problem}")
        stored = self._stored(body, current["metadata"], request.match_info["ns"], path)
        objects[name] = stored
        self._record(_Event(self._version, path, "MODIFIED", stored, current))
        return web.json_response(stored)

    def _create(self, request: web.Request, path: str, body: Obj) -> web.Response:
        resource = request.match_info["resource"]
        name = (body.get("metadata") or {}).get("name")
        problem = _invalid(body, resource)
        if problem:
            return _status(422, "Invalid", f'{resource} "{name}" is invalid: {problem}')
        if str(name) in self._objects[path]:
            return _status(409, "AlreadyExists", f'{resource} "{name}" already exists')
        meta = {"uid": str(uuid.uuid4()), "creationTimestamp": _now()}
        stored = self._stored(body, meta, request.match_info["ns"], path)
        self._objects[path][str(name)] = stored
        self._record(_Event(self._version, path, "ADDED", stored))
        return web.json_response(stored, status=201)

    def _stored(self, body: Obj, server_meta: Mapping[str, Any], namespace: str, path: str) -> Obj:
        kind, api_version = _kind(path)
        meta = {**(body.get("metadata") or {}), "namespace": namespace}
        meta["uid"], meta["creationTimestamp"] = (
            server_meta["uid"],
            server_meta["creationTimestamp"],
        )
        meta["resourceVersion"] = str(self._next())
        return {
            **json.loads(json.dumps(body)),
            "kind": kind,
            "apiVersion": api_version,
            "metadata": meta,
        }

    def _list(self, request: web.Request, path: str) -> web.Response:
        selector = _selector(request.query.get("labelSelector", ""))
        if selector is None:
            return _status(400, "BadRequest", "unable to parse requirement")
        items = [o for o in self._objects[path].values() if _matches(o, selector)]
        kind = _kind(path)[0]
        meta = {"resourceVersion": str(self._version)}
        return web.json_response({"kind": f"{kind}List", "metadata": meta, "items": items})

    async def _watch(self, request: web.Request, path: str) -> web.StreamResponse:
        selector = _selector(request.query.get("labelSelector", ""))
        if selector is None:
            return _status(400, "BadRequest", "unable to parse requirement")
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        since = request.query.get("resourceVersion", "")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        # From here to the backlog without an await: each event is in the backlog or queued.
        watcher = _Watcher(path)
        self._watchers.add(watcher)
        index = len(self.events_sent)
        self.events_sent.append(0)

        async def send(kind: str, obj: Obj) -> None:
            self.events_sent[index] += 1
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        try:
            if since in ("", "0"):
                backlog = [_Event(0, path, "ADDED", o) for o in self._objects[path].values()]
            elif not since.isdigit() or int(since) < self._floor:
                await send("ERROR", _too_old(since))
                return response
            else:
                backlog = [
                    e for e in self._history if e.collection == path and e.version > int(since)
                ]
            for event in backlog:
                await _send_event(send, event, selector)
            await self._live(watcher, send, selector, timeout, bookmarks)
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watchers.discard(watcher)
        if watcher.queue.qsize() and request.transport is not None:
            request.transport.close()  # broken on purpose: end without the last chunk
            return response
        with contextlib.suppress(ConnectionResetError):  # the client left as it ended
            await response.write_eof()
        return response

    async def _live(
        self,
        watcher: _Watcher,
        send: Callable[[str, Obj], Awaitable[None]],
        selector: Mapping[str, str],
        timeout: float,
        bookmarks: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        kind, api_version = _kind(watcher.collection)
        while (left := deadline - loop.time()) > 0:
            try:
                async with asyncio.timeout(min(left, self.bookmark_interval)):
                    event = await watcher.queue.get()
            except TimeoutError:
                if bookmarks and deadline - loop.time() > 0:
                    meta = {"resourceVersion": str(self._version)}
                    await send(
                        "BOOKMARK", {"kind": kind, "apiVersion": api_version, "metadata": meta}
                    )
                continue
            if event is None:
                watcher.queue.put_nowait(None)  # tells the handler to break the stream
                return
            await _send_event(send, event, selector)

    def _next(self) -> int:
        self._version += 1
        return self._version

    def _record(self, event: _Event) -> None:
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].version
        self._history.append(event)
        for watcher in list(self._watchers):
            if watcher.collection == event.collection:
                _offer(watcher, event)


@asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[tuple[KubeApi, KubeClient]]:
    """A started fake (`KubeApi(**options)`) and a client of it with its token."""
    api = await KubeApi(**options).start()
    client = KubeClient(api.url, token=api.token)
    try:
        yield api, client
    finally:
        await client.close()
        await api.close()


async def eventually(check: Callable[[], object], seconds: float = 3.0) -> None:
    """Return once `check()` is true; AssertionError after `seconds`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not true within {seconds} s")
        await asyncio.sleep(0.01)


def _offer(watcher: _Watcher, event: _Event | None) -> None:
    """Queue an event; a watcher too far behind is broken, as the real server drops it."""
    try:
        watcher.queue.put_nowait(event)
    except asyncio.QueueFull:
        watcher.queue.get_nowait()
        watcher.queue.put_nowait(None)


async def _send_event(
    send: Callable[[str, Obj], Awaitable[None]], event: _Event, selector: Mapping[str, str]
) -> None:
    now = _matches(event.obj, selector)
    before = event.old is not None and _matches(event.old, selector)
    if event.type == "MODIFIED" and before != now:
        await send("ADDED" if now else "DELETED", event.obj)
    elif now:
        await send(event.type, event.obj)


def _too_old(since: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {since[:20]}",
        "reason": "Expired",
        "code": 410,
    }


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


async def _body(request: web.Request) -> Obj:
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="the body is not JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="the body is not an object")
    return body


def _invalid(body: Obj, resource: str) -> str:
    """What the real server's validation would say about `body` ("" when it is valid)."""
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        return "metadata: Required value"
    name = meta.get("name")
    if not isinstance(name, str) or len(name) > 253 or not _SUBDOMAIN.match(name):
        return "metadata.name: Invalid value: a lowercase RFC 1123 subdomain must consist of ..."
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, label = key.rpartition("/")
        if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
            return f"metadata.labels: Invalid value: {key!r}: prefix part must be a subdomain"
        if len(label) > 63 or not _LABEL_NAME.match(label):
            return f"metadata.labels: Invalid value: {key!r}: name part must consist of ..."
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            return f"metadata.labels: Invalid value: {value!r}: a valid label must be ..."
    if resource == "configmaps":
        size = sum(len(str(v).encode()) for v in (body.get("data") or {}).values())
        size += sum(len(base64.b64decode(v)) for v in (body.get("binaryData") or {}).values())
        if size > MAX_CONFIGMAP:
            return f"[]: Too long: must have at most {MAX_CONFIGMAP} bytes"
    return ""


def _selector(text: str) -> dict[str, str] | None:
    """An equality selector `a=b,c==d` as a map, or None if it is not one."""
    selector = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.replace("==", "=").partition("=")
        if not sep or not key or "!" in key:
            return None
        selector[key.strip()] = value.strip()
    return selector


def _matches(obj: Obj, selector: Mapping[str, str]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _kind(collection: str) -> tuple[str, str]:
    """The kind and apiVersion of a collection's objects, from its path."""
    root, _, rest = collection.strip("/").partition("/namespaces/")
    return KINDS[(root, rest.rsplit("/", 1)[1])]


def _with_version(obj: Obj, version: int) -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(version)}}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
