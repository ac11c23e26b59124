"""An in-process Kubernetes API server over real HTTP on 127.0.0.1, for the real kubernetes_asyncio client.

It keeps the semantics that remediation code depends on: a cluster-wide resourceVersion, 409 on
stale writes, JSON merge/JSON patch (with `test` ops), schema validation on every write (422 with
the field path), watches (below), plus fault injection (403/5xx/latency), hooks, and a record of
every request.

Watches follow the API server's watch cache: `?watch=true` streams one JSON event per line
(ADDED, MODIFIED, DELETED, BOOKMARK, ERROR). Without a resourceVersion (or "0") the stream starts
with a synthetic ADDED per object that exists, then follows; from a resourceVersion it replays
what changed after it, as long as the history still holds it, and else answers an ERROR event
with a 410 Expired Status ("too old resource version"), after which a client lists again.
Selectors filter as the cache does: an object that stops matching is sent as DELETED, one that
starts matching as ADDED. With allowWatchBookmarks=true a BOOKMARK carries the resourceVersion
every `bookmark_interval_seconds` while no event is waiting; timeoutSeconds ends the stream.
`compact()` drops the history (the next watch from an older version gets 410), `end_watches()`
ends every open stream (an API server restart), `watchers` counts the open ones.

Why not kmock's KubernetesEmulator: it merges PUT bodies like patches, has no resourceVersion,
no JSON patch and no validation, and mutates state before user reactions run; overriding it would
replace nearly all of it, so this is a small aiohttp app instead (kmock stays the model).
"""
from __future__ import annotations

import asyncio
import copy
import datetime
import inspect
import itertools
import json
import re
import secrets
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator, Mapping

import jsonpatch
import jsonpointer
from aiohttp import web

from lab.kube._selectors import SelectorError, parse_label_selector
from lab.kube.schemas import SchemaRegistry, default_registry
from lab.kube.workloads import HPA_MANAGER, apply_defaults, clamped_replicas, scales, semantic_errors

Obj = dict[str, Any]
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
_TRUE = ("1", "t", "T", "true", "TRUE", "True")  # what Go's strconv.ParseBool reads as true
WATCH_HISTORY = 10_000
"""Events kept for watches that resume from a resourceVersion; older ones are compacted away."""
DEFAULT_WATCH_TIMEOUT_SECONDS = 1800.0
"""A watch without timeoutSeconds ends after this (the API server picks 30 to 60 minutes)."""


@dataclass(frozen=True)
class ResourceType:
    """One served resource. `custom` ones behave like CRDs (status subresource, generation, no SMP)."""

    group: str
    versions: tuple[str, ...]  # storage version first
    plural: str
    kind: str
    custom: bool = False

    @property
    def qualified(self) -> str:
        """`virtualservices.networking.istio.io`, or `configmaps` for the core group."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    def matches(self, spec: str) -> bool:
        """Whether a fault/hook resource spec (`*`, plural or plural.group) names this resource."""
        return spec in ("*", self.plural, self.qualified)


ISTIO_VERSIONS = ("v1", "v1beta1", "v1alpha3")
RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", ("v1",), "configmaps", "ConfigMap"),
    ResourceType("", ("v1",), "events", "Event"),
    ResourceType("", ("v1",), "services", "Service"),
    ResourceType("discovery.k8s.io", ("v1",), "endpointslices", "EndpointSlice"),
    ResourceType("coordination.k8s.io", ("v1",), "leases", "Lease"),
    # Deployments and their HPAs, with the defaults, checks and HPA floor of lab/kube/workloads.py.
    ResourceType("apps", ("v1",), "deployments", "Deployment"),
    ResourceType("autoscaling", ("v2",), "horizontalpodautoscalers", "HorizontalPodAutoscaler"),
    ResourceType("networking.istio.io", ISTIO_VERSIONS, "virtualservices", "VirtualService", True),
    ResourceType("networking.istio.io", ISTIO_VERSIONS, "destinationrules", "DestinationRule", True),
    ResourceType("gateway.networking.k8s.io", ("v1", "v1beta1"), "httproutes", "HTTPRoute", True),
)


class ApiError(Exception):
    """A failure answered as a Kubernetes `Status` object."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = dict(details or {})

    def status(self) -> Obj:
        return {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "details": self.details, "code": self.code,
        }


class InvalidObject(ValueError):
    """Raised by the direct (non-HTTP) state API when an object fails schema validation."""


@dataclass
class RecordedRequest:
    """One HTTP request as the emulator saw it; `status` is the code it answered."""

    method: str
    path: str
    query: Mapping[str, str]
    verb: str  # get, list, create, update, patch, delete, or "unknown"
    resource: str  # plural, "" when the path named no known resource
    group: str
    version: str
    namespace: str | None
    name: str | None
    content_type: str
    body: Any
    status: int = 0
    user_agent: str = ""


@dataclass(frozen=True)
class WriteRecord:
    """One change the API made to stored state (the object as stored afterwards, or as deleted)."""

    verb: str
    resource: ResourceType
    object: Obj


@dataclass
class Fault:
    """Injected behaviour for matching requests: latency, then (optionally) an error status."""

    verb: str
    resource: str
    status: int | None = None
    latency_seconds: float = 0.0
    times: int | None = None  # None: every matching request
    name: str | None = None  # only this object name, when set
    fired: int = 0

    def matches(self, rec: RecordedRequest, rt: ResourceType) -> bool:
        return (self.verb in ("*", rec.verb) and rt.matches(self.resource)
                and self.name in (None, rec.name)
                and (self.times is None or self.fired < self.times))


HookFn = Callable[["KubeEmulator", RecordedRequest], "Awaitable[None] | None"]


@dataclass
class Hook:
    """A callback run after a matching request was handled and before its response is sent."""

    verb: str
    resource: str
    fn: HookFn
    times: int | None = 1
    fired: int = 0


@dataclass
class _Watcher:
    """One open watch stream: what it selects and the events waiting to be written (None: end)."""

    rt: ResourceType
    version: str
    namespace: str | None
    selects: Callable[[Mapping[str, Any]], bool]
    queue: "asyncio.Queue[Obj | None]"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _body_fields(obj: Mapping[str, Any]) -> Obj:
    # What counts for `generation`: everything except metadata and status (the CRD rule).
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class KubeEmulator:
    """The emulator. Start it (`async with` or start/stop), point a client at `url`.

    State is read and changed without awaits in between, so each request is atomic on the loop.
    """

    def __init__(self, *, registry: SchemaRegistry | None = None,
                 user: str = "system:serviceaccount:tailguard:tailguard") -> None:
        self.registry = registry or default_registry()
        self.user = user  # named in 403 messages, as RBAC does
        self.requests: list[RecordedRequest] = []
        self.writes: list[WriteRecord] = []
        self.faults: list[Fault] = []
        self.hooks: list[Hook] = []
        self._store: dict[tuple[str, str, str, str], Obj] = {}
        self._rv = itertools.count(1000)
        self._last_rv = 999
        # Watches: the history of changes (resourceVersion, type, resource, object after, object
        # before), the oldest resourceVersion a watch may resume from, and the open streams.
        self._history: list[tuple[int, str, ResourceType, Obj, Obj | None]] = []
        self._oldest_rv = 999
        self._watchers: list[_Watcher] = []
        self.bookmark_interval_seconds = 5.0
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "KubeEmulator":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configuration(self) -> Any:
        """A kubernetes_asyncio Configuration pointing at this emulator (no auth, plain HTTP)."""
        from kubernetes_asyncio.client import Configuration

        return Configuration(host=self.url)

    # ---- fault injection, hooks, records ---------------------------------------------------
    def inject(self, verb: str, resource: str, *, status: int | None = None,
               latency_seconds: float = 0.0, times: int | None = None,
               name: str | None = None) -> Fault:
        """Add a fault for (verb, resource); `times=None` means always. Returns it (see `.fired`).

        Args:
            verb: get, list, create, update, patch, delete or `*`.
            resource: plural (`virtualservices`), plural.group, or `*`.
            status: 403 answers Forbidden as RBAC would; 5xx answers InternalError; None: latency only.
        """
        if verb != "*" and verb not in VERBS:
            raise ValueError(f"unknown verb {verb!r}; one of {VERBS}")
        fault = Fault(verb, resource, status, latency_seconds, times, name)
        self.faults.append(fault)
        return fault

    def forbid(self, verb: str, resource: str, *, times: int | None = None) -> Fault:
        """Shorthand: RBAC denies (verb, resource)."""
        return self.inject(verb, resource, status=403, times=times)

    def after(self, verb: str, resource: str, fn: HookFn, *, times: int | None = 1) -> Hook:
        """Run `fn(emulator, request)` after a matching request is handled, before it is answered.

        It runs whatever the answer's status (see `request.status`); `times=None` means always.
        The typical use is a concurrent edit: mutate the object (`modify`) right after a GET.
        """
        hook = Hook(verb, resource, fn, times)
        self.hooks.append(hook)
        return hook

    def requests_for(self, verb: str | None = None, resource: str | None = None) -> list[RecordedRequest]:
        """Recorded requests filtered by verb and resource (plural or plural.group)."""
        return [r for r in self.requests
                if verb in (None, r.verb)
                and (resource is None or resource in (r.resource, f"{r.resource}.{r.group}"))]

    # ---- direct state API (no HTTP; what "someone else" does to the cluster) -------------------
    def resource_type(self, spec: str) -> ResourceType:
        """Look a resource up by plural, plural.group or Kind."""
        for rt in RESOURCES:
            if spec in (rt.plural, rt.qualified, rt.kind):
                return rt
        raise KeyError(f"resource {spec!r} is not served by the emulator")

    def seed(self, obj: Mapping[str, Any]) -> Obj:
        """Store a new object as a create would (validated, with uid/resourceVersion); returns it."""
        rt = self._type_for_object(obj)
        namespace = obj.get("metadata", {}).get("namespace", "default")
        try:
            stored = self._create(rt, namespace, copy.deepcopy(dict(obj)), keep_status=True)
        except ApiError as err:
            raise InvalidObject(err.message) from err
        return copy.deepcopy(stored)

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        """A copy of the stored object (in its storage version), or None."""
        rt = self.resource_type(resource)
        found = self._store.get((rt.group, rt.plural, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def modify(self, resource: str, namespace: str, name: str, fn: Callable[[Obj], None]) -> Obj:
        """An out-of-band edit by another actor: `fn` mutates a copy; it is validated and stored.

        Returns the stored object; its resourceVersion is new, so older writers get 409.
        """
        rt = self.resource_type(resource)
        current = self._get_or_404(rt, namespace, name)
        desired = copy.deepcopy(current)
        fn(desired)
        try:
            stored, _ = self._replace(rt, current, desired, keep_status=True)
        except ApiError as err:
            raise InvalidObject(err.message) from err
        return copy.deepcopy(stored)

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """Copies of every stored object of one resource, optionally in one namespace."""
        rt = self.resource_type(resource)
        return [copy.deepcopy(o) for (g, p, ns, _), o in sorted(self._store.items())
                if (g, p) == (rt.group, rt.plural) and namespace in (None, ns)]

    @property
    def resource_version(self) -> int:
        """The cluster-wide counter: the resourceVersion of the latest write."""
        return self._last_rv

    def delete(self, resource: str, namespace: str, name: str) -> None:
        """An out-of-band delete by another actor (watchers see DELETED)."""
        rt = self.resource_type(resource)
        self._delete(rt, self._get_or_404(rt, namespace, name), None)

    def compact(self) -> None:
        """Forget the change history (etcd compaction): a watch from an older version gets 410."""
        self._history.clear()
        self._oldest_rv = self._last_rv

    def end_watches(self) -> None:
        """End every open watch stream (the API server restarted or timed them out)."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        self._watchers.clear()

    @property
    def watchers(self) -> int:
        """Watch streams open now."""
        return len(self._watchers)

    def _type_for_object(self, obj: Mapping[str, Any]) -> ResourceType:
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        for rt in RESOURCES:
            if rt.kind == kind and any(rt.api_version(v) == api_version for v in rt.versions):
                return rt
        raise KeyError(f"{api_version}/{kind} is not served by the emulator")

    # ---- HTTP ---------------------------------------------------------------------------------
    _CORE = re.compile(r"^/api/(?P<version>v1)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?P<sub>/.*)?$")
    _GROUP = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?P<sub>/.*)?$")

    def _route(self, path: str) -> tuple[ResourceType, str, str | None, str | None, str | None] | None:
        match = self._CORE.match(path) or self._GROUP.match(path)
        if match is None:
            return None
        parts = match.groupdict()
        group = parts.get("group") or ""
        for rt in RESOURCES:
            if rt.group == group and rt.plural == parts["plural"] and parts["version"] in rt.versions:
                return rt, parts["version"], parts["ns"], parts["name"], parts["sub"]
        return None

    @staticmethod
    def _verb(method: str, name: str | None, query: Mapping[str, str]) -> str:
        if method == "GET" and not name:
            return "watch" if query.get("watch") in _TRUE else "list"
        if method == "POST":
            return "unknown" if name else "create"
        if not name:  # deletecollection and friends are not emulated
            return "unknown"
        return {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "unknown")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        routed = self._route(request.path)
        query = dict(request.query)
        rt, version, namespace, name, sub = routed if routed else (None, "", None, None, None)
        rec = RecordedRequest(
            method=request.method, path=request.path, query=query,
            verb=self._verb(request.method, name, query) if rt else "unknown",
            resource=rt.plural if rt else "", group=rt.group if rt else "", version=version,
            namespace=namespace, name=name,
            content_type=request.headers.get("Content-Type", "").split(";")[0].strip(), body=body,
            user_agent=request.headers.get("User-Agent", ""))
        self.requests.append(rec)
        try:
            if rt is None or sub is not None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            await self._apply_faults(rec, rt)
            if rec.verb == "watch":
                return await self._watch(request, rec, rt)
            code, payload = self._dispatch(rec, rt, body)
        except ApiError as err:
            code, payload = err.code, err.status()
        rec.status = code
        if rt is not None:
            await self._run_hooks(rec, rt)
        return web.json_response(payload, status=code)

    async def _apply_faults(self, rec: RecordedRequest, rt: ResourceType) -> None:
        for fault in self.faults:
            if not fault.matches(rec, rt):
                continue
            fault.fired += 1
            if fault.latency_seconds:
                await asyncio.sleep(fault.latency_seconds)
            if fault.status == 403:
                target = f'{rt.qualified} "{rec.name}"' if rec.name else rt.qualified
                scope = f' in the namespace "{rec.namespace}"' if rec.namespace else " at the cluster scope"
                raise ApiError(403, "Forbidden", (
                    f'{target} is forbidden: User "{self.user}" cannot {rec.verb} resource '
                    f'"{rt.plural}" in API group "{rt.group}"{scope}'),
                    {"name": rec.name or "", "group": rt.group, "kind": rt.plural})
            if fault.status is not None:
                reason = "ServiceUnavailable" if fault.status == 503 else "InternalError"
                raise ApiError(fault.status, reason,
                               f"Internal error occurred: injected fault ({rec.verb} {rt.qualified})",
                               {"causes": [{"message": "injected fault"}]})

    async def _run_hooks(self, rec: RecordedRequest, rt: ResourceType) -> None:
        for hook in list(self.hooks):
            if (hook.verb in ("*", rec.verb) and rt.matches(hook.resource)
                    and (hook.times is None or hook.fired < hook.times)):
                hook.fired += 1
                result = hook.fn(self, rec)
                if inspect.isawaitable(result):
                    await result

    def _dispatch(self, rec: RecordedRequest, rt: ResourceType, body: Any) -> tuple[int, Obj]:
        ns = rec.namespace
        if rec.verb == "list":
            return 200, self._list(rt, rec.version, ns, rec.query)
        if ns is None or rec.verb == "unknown":
            raise ApiError(405, "MethodNotAllowed",
                           "the server does not allow this method on the requested resource")
        if rec.verb == "get":
            return 200, self._as_version(rt, self._get_or_404(rt, ns, rec.name or ""), rec.version)
        if rec.verb == "create":
            obj = self._decode(rt, rec.version, body)
            if obj.get("metadata", {}).get("resourceVersion"):
                # etcd3 storage refuses it with a plain error, which the server answers as 500.
                raise ApiError(500, "InternalError", "Internal error occurred: "
                               "resourceVersion should not be set on objects to be created")
            _track_fields(obj, None, _field_manager(rec), rt.api_version(rec.version))
            stored = self._create(rt, ns, obj, keep_status=False)
            self.writes.append(WriteRecord("create", rt, copy.deepcopy(stored)))
            return 201, self._as_version(rt, stored, rec.version)
        assert rec.name is not None
        current = self._get_or_404(rt, ns, rec.name)
        if rec.verb == "delete":
            return 200, self._delete(rt, current, body)
        if rec.verb == "update":
            desired = self._decode(rt, rec.version, body)
            sent_rv = desired.get("metadata", {}).get("resourceVersion")
            if not sent_rv and rt.custom:
                raise self._invalid(rt, rec.name, [(
                    "metadata.resourceVersion",
                    "Invalid value: 0x0: must be specified for an update")])
        else:
            desired = self._patched(rt, rec, current, body)
            sent_rv = desired.get("metadata", {}).get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            raise self._conflict(rt, rec.name)
        _track_fields(desired, current, _field_manager(rec), rt.api_version(rec.version))
        stored, changed = self._replace(rt, current, desired, keep_status=False)
        if changed:
            self.writes.append(WriteRecord(rec.verb, rt, copy.deepcopy(stored)))
        return 200, self._as_version(rt, stored, rec.version)

    # ---- semantics ----------------------------------------------------------------------------
    def _next_rv(self) -> str:
        self._last_rv = next(self._rv)
        return str(self._last_rv)

    def _get_or_404(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        found = self._store.get((rt.group, rt.plural, namespace, name))
        if found is None:
            raise ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found',
                           {"name": name, "group": rt.group, "kind": rt.plural})
        return found

    @staticmethod
    def _as_version(rt: ResourceType, obj: Obj, version: str) -> Obj:
        # All served versions of our CRDs share one schema, so conversion is a relabel.
        out = copy.deepcopy(obj)
        out["apiVersion"] = rt.api_version(version)
        return out

    @staticmethod
    def _decode(rt: ResourceType, version: str, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request is not a JSON object")
        expected = rt.api_version(version)
        # The server fills a missing apiVersion/kind from the URL and rejects a mismatch.
        if body.setdefault("apiVersion", expected) != expected:
            raise ApiError(400, "BadRequest", f"the API version in the data ({body['apiVersion']}) "
                           f"does not match the expected API version ({expected})")
        if body.setdefault("kind", rt.kind) != rt.kind:
            raise ApiError(400, "BadRequest", f"the kind in the data ({body['kind']}) "
                           f"does not match the expected kind ({rt.kind})")
        if not isinstance(body.setdefault("metadata", {}), dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        return body

    def _validate(self, rt: ResourceType, obj: Obj) -> None:
        errors = [(e.field, f"Invalid value: {e.message}") for e in self.registry.errors(obj)]
        errors += semantic_errors(rt.kind, obj)
        if errors:
            raise self._invalid(rt, obj.get("metadata", {}).get("name", ""), errors)

    @staticmethod
    def _invalid(rt: ResourceType, name: str, errors: list[tuple[str, str]]) -> ApiError:
        texts = [f"{path}: {message}" for path, message in errors]
        summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
        return ApiError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {summary}', {
            "name": name, "group": rt.group, "kind": rt.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": m, "field": p} for p, m in errors],
        })

    @staticmethod
    def _conflict(rt: ResourceType, name: str) -> ApiError:
        return ApiError(409, "Conflict", (
            f'Operation cannot be fulfilled on {rt.qualified} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again"),
            {"name": name, "group": rt.group, "kind": rt.plural})

    def _create(self, rt: ResourceType, namespace: str, obj: Obj, *, keep_status: bool) -> Obj:
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match "
                           "the namespace sent on the request")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise self._invalid(rt, "", [("metadata.name",
                                          "Required value: name or generateName is required")])
        key = (rt.group, rt.plural, namespace, meta["name"])
        if key in self._store:
            raise ApiError(409, "AlreadyExists", f'{rt.qualified} "{meta["name"]}" already exists',
                           {"name": meta["name"], "group": rt.group, "kind": rt.plural})
        if rt.custom and not keep_status:
            obj.pop("status", None)  # the status subresource owns it
        obj["apiVersion"] = rt.api_version(rt.versions[0])
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
        if rt.custom:
            meta["generation"] = 1
        meta["resourceVersion"] = "0"  # placeholder so the schema sees the final shape
        apply_defaults(rt.kind, obj)
        self._validate(rt, obj)
        meta["resourceVersion"] = self._next_rv()
        self._store[key] = obj
        self._changed("ADDED", rt, obj, None)
        self._autoscale(rt, obj)
        return obj

    def _replace(self, rt: ResourceType, current: Obj, desired: Obj, *, keep_status: bool) -> tuple[Obj, bool]:
        old_meta, meta = current["metadata"], desired.setdefault("metadata", {})
        for field_name in ("name", "namespace"):
            if meta.get(field_name, old_meta[field_name]) != old_meta[field_name]:
                raise ApiError(400, "BadRequest", f"the {field_name} of the object "
                               f"({meta[field_name]}) does not match the {field_name} on the URL "
                               f"({old_meta[field_name]})")
        # System fields belong to the server, whatever the client sent.
        for field_name in ("name", "namespace", "uid", "creationTimestamp", "generation"):
            if field_name in old_meta:
                meta[field_name] = old_meta[field_name]
        meta["resourceVersion"] = old_meta["resourceVersion"]
        desired["apiVersion"], desired["kind"] = current["apiVersion"], current["kind"]
        if rt.custom and not keep_status:
            desired.pop("status", None)
            if "status" in current:
                desired["status"] = copy.deepcopy(current["status"])
        apply_defaults(rt.kind, desired)
        if desired == current:
            return current, False  # a no-op write does not bump resourceVersion, as in etcd
        if rt.custom and _body_fields(desired) != _body_fields(current):
            meta["generation"] = old_meta.get("generation", 1) + 1
        self._validate(rt, desired)
        meta["resourceVersion"] = self._next_rv()
        self._store[(rt.group, rt.plural, old_meta["namespace"], old_meta["name"])] = desired
        self._changed("MODIFIED", rt, desired, current)
        self._autoscale(rt, desired)
        return desired, True

    def _autoscale(self, rt: ResourceType, written: Obj) -> None:
        """The HPA controller after a write to an HPA or a Deployment: every Deployment an HPA of the
        namespace scales is kept within its floor and ceiling (lab/kube/workloads.py)."""
        if rt.kind not in ("Deployment", "HorizontalPodAutoscaler"):
            return
        apps, hpas = self.resource_type("deployments"), self.resource_type("horizontalpodautoscalers")
        namespace = written["metadata"]["namespace"]
        for hpa in list(self._iter(hpas, namespace)):
            for deployment in list(self._iter(apps, namespace)):
                replicas = int(deployment["spec"].get("replicas", 1))
                wanted = clamped_replicas(hpa, replicas) if scales(hpa, deployment) else replicas
                if wanted != replicas:
                    scaled = copy.deepcopy(deployment)
                    scaled["spec"]["replicas"] = wanted
                    _track_fields(scaled, deployment, HPA_MANAGER, "apps/v1")
                    self._replace(apps, deployment, scaled, keep_status=True)

    def _patched(self, rt: ResourceType, rec: RecordedRequest, current: Obj, body: Any) -> Obj:
        base = self._as_version(rt, current, rec.version)
        if rec.content_type == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value "
                               "of type jsonpatch.Patch")
            try:
                return jsonpatch.JsonPatch(body).apply(base)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException,
                    KeyError, TypeError, ValueError):
                # The real server answers every apply failure (a failed `test` included) with
                # this generic 422; the evanphx error text is not passed on to the client.
                raise ApiError(422, "Invalid",
                               "the server rejected our request due to an error in our request")
        smp = rec.content_type == "application/strategic-merge-patch+json"
        if rec.content_type == "application/merge-patch+json" or (smp and not rt.custom):
            # Strategic merge on core types is treated as a merge patch (lists replace).
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the body of the request is not a JSON object")
            return merge_patch(base, body)
        raise ApiError(415, "UnsupportedMediaType", (
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json-patch+json, application/merge-patch+json"
            + ("" if rt.custom else ", application/strategic-merge-patch+json")))

    def _delete(self, rt: ResourceType, current: Obj, body: Any) -> Obj:
        meta = current["metadata"]
        preconditions = (body.get("preconditions") if isinstance(body, dict) else None) or {}
        if preconditions.get("resourceVersion") not in (None, meta["resourceVersion"]):
            raise self._conflict(rt, meta["name"])
        if preconditions.get("uid") not in (None, meta["uid"]):
            raise self._conflict(rt, meta["name"])
        del self._store[(rt.group, rt.plural, meta["namespace"], meta["name"])]
        gone = copy.deepcopy(current)
        gone["metadata"]["resourceVersion"] = self._next_rv()  # as the server sends it: at the delete
        self._changed("DELETED", rt, gone, None)
        self.writes.append(WriteRecord("delete", rt, copy.deepcopy(current)))
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": meta["name"], "group": rt.group, "kind": rt.plural,
                            "uid": meta["uid"]}}

    @staticmethod
    def _selector(query: Mapping[str, str]) -> Callable[[Mapping[str, Any]], bool]:
        """Whether an object matches the request's labelSelector and fieldSelector (metadata fields)."""
        try:
            labels = parse_label_selector(query.get("labelSelector", ""))
        except SelectorError as err:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {err}")
        fields = dict(term.split("=", 1) for term in query.get("fieldSelector", "").split(",") if "=" in term)

        def selects(obj: Mapping[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            return labels(meta.get("labels") or {}) and all(
                meta.get(k.removeprefix("metadata.")) == v for k, v in fields.items())

        return selects

    def _list(self, rt: ResourceType, version: str, namespace: str | None,
              query: Mapping[str, str]) -> Obj:
        selects = self._selector(query)
        items = []
        for obj in self._iter(rt, namespace):
            if not selects(obj):
                continue
            item = self._as_version(rt, obj, version)
            if not rt.custom:  # built-in lists omit each item's apiVersion/kind
                item.pop("apiVersion"), item.pop("kind")
            items.append(item)
        return {"apiVersion": rt.api_version(version), "kind": f"{rt.kind}List",
                "metadata": {"resourceVersion": str(self._last_rv)}, "items": items}

    # ---- watches ------------------------------------------------------------------------------
    def _changed(self, kind: str, rt: ResourceType, obj: Obj, before: Obj | None) -> None:
        """A stored change: into the history and to every open watch it concerns."""
        rv = int(obj["metadata"]["resourceVersion"])
        after, prior = copy.deepcopy(obj), copy.deepcopy(before) if before is not None else None
        self._history.append((rv, kind, rt, after, prior))
        if len(self._history) > WATCH_HISTORY:
            dropped = self._history.pop(0)
            self._oldest_rv = dropped[0]
        for watcher in self._watchers:
            event = self._event_for(watcher, kind, rt, after, prior)
            if event is not None:
                watcher.queue.put_nowait(event)

    def _event_for(self, watcher: _Watcher, kind: str, rt: ResourceType, obj: Obj, before: Obj | None) -> Obj | None:
        """The event `watcher` gets for a change, or None; a MODIFIED that moves an object into or
        out of the selection is an ADDED or DELETED, as the watch cache sends it."""
        if rt != watcher.rt or watcher.namespace not in (None, obj["metadata"].get("namespace")):
            return None
        now = watcher.selects(obj)
        if kind == "MODIFIED" and before is not None:
            was = watcher.selects(before)
            if not was and not now:
                return None
            if was and not now:
                gone = copy.deepcopy(before)
                gone["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
                return {"type": "DELETED", "object": self._as_version(rt, gone, watcher.version)}
            kind = "MODIFIED" if was else "ADDED"
        elif not now:
            return None
        return {"type": kind, "object": self._as_version(rt, obj, watcher.version)}

    async def _watch(self, request: web.Request, rec: RecordedRequest, rt: ResourceType) -> web.StreamResponse:
        query = rec.query
        watcher = _Watcher(rt, rec.version, rec.namespace, self._selector(query), asyncio.Queue())
        since = query.get("resourceVersion", "")
        if since not in ("", "0") and not since.isdigit():
            raise ApiError(400, "BadRequest", f'invalid resource version "{since}"')
        try:
            timeout = float(query.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_SECONDS)
        except ValueError:
            raise ApiError(400, "BadRequest", "timeoutSeconds must be a number")
        bookmarks = query.get("allowWatchBookmarks") in _TRUE
        # Everything up to `start` is sent before anything newer: computed and registered without an
        # await in between, so no change falls between the replay and the live events.
        first: list[Obj] = []
        if since in ("", "0"):
            first = [{"type": "ADDED", "object": self._as_version(rt, o, rec.version)}
                     for o in self._iter(rt, rec.namespace) if watcher.selects(o)]
        elif int(since) < self._oldest_rv:
            first = [{"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": f"too old resource version: {since} ({self._oldest_rv})", "reason": "Expired",
                "code": 410}}]
            timeout = 0.0
        else:
            for erv, kind, ert, obj, before in self._history:
                event = self._event_for(watcher, kind, ert, obj, before) if erv > int(since) else None
                if event is not None:
                    first.append(event)
        if timeout > 0:
            self._watchers.append(watcher)
        rec.status = 200
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        ends = loop.time() + timeout
        try:
            for event in first:
                await response.write(json.dumps(event).encode() + b"\n")
            while loop.time() < ends:
                wait = ends - loop.time()
                if bookmarks:
                    wait = min(wait, self.bookmark_interval_seconds)
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), timeout=max(wait, 0.0))
                except asyncio.TimeoutError:
                    if bookmarks and watcher.queue.empty() and loop.time() < ends:
                        event = {"type": "BOOKMARK", "object": {
                            "kind": rt.kind, "apiVersion": rt.api_version(rec.version),
                            "metadata": {"resourceVersion": str(self._last_rv)}}}
                    else:
                        continue
                if event is None:
                    break
                await response.write(json.dumps(event).encode() + b"\n")
        except ConnectionResetError:
            pass  # the client went away
        finally:
            if watcher in self._watchers:
                self._watchers.remove(watcher)
        return response

    def _iter(self, rt: ResourceType, namespace: str | None) -> Iterator[Obj]:
        for (group, plural, ns, _), obj in sorted(self._store.items()):
            if (group, plural) == (rt.group, rt.plural) and namespace in (None, ns):
                yield obj


# ---- managedFields (server-side field ownership, operation Update) ---------------------------------
# As the API server records it on every create, update and patch: the manager is the `fieldManager`
# query parameter, else the User-Agent up to its first "/" (at most 128 characters); it takes over
# the fields the request changed (other managers lose them; a manager left with none is dropped),
# and fields the request removed leave every manager. Lists are atomic (owned whole), maps are
# owned per key, with "." for a keyed map itself, as in FieldsV1. A write that changes nothing records nothing.

_SYSTEM_METADATA = frozenset({"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                              "managedFields", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds"})
Path_ = tuple[str, ...]


def _field_manager(rec: RecordedRequest) -> str:
    given = rec.query.get("fieldManager")
    return (given or rec.user_agent.split("/")[0] or "unknown")[:128]


def _tracked(obj: Mapping[str, Any]) -> Obj:
    """What field ownership covers: not apiVersion/kind, status (its subresource) or system metadata."""
    out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status", "metadata")}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _SYSTEM_METADATA}
    if meta:
        out["metadata"] = meta
    return out


# Maps with free-form keys: their own existence is a field ("."), as for `map[string]string` in the
# schema; structs (metadata, spec ...) are not.
_KEYED_MAPS = frozenset({"f:data", "f:binaryData", "f:labels", "f:annotations", "f:matchLabels", "f:nodeSelector"})


def _paths(value: Any, prefix: Path_ = ()) -> dict[Path_, Any]:
    """Every owned path: keyed maps (their own path, marked by a trailing "."), and leaves (with their value)."""
    out: dict[Path_, Any] = {}
    if isinstance(value, dict):
        if prefix and prefix[-1] in _KEYED_MAPS:
            out[prefix + (".",)] = True
        for key, item in value.items():
            out.update(_paths(item, prefix + (f"f:{key}",)))
    elif prefix:
        out[prefix] = value
    return out


def _from_fields_v1(fields: Any, prefix: Path_ = ()) -> set[Path_]:
    out: set[Path_] = set()
    if not isinstance(fields, dict):
        return out
    for key, item in fields.items():
        if key == ".":
            out.add(prefix + (".",))
        elif isinstance(item, dict) and item:
            out |= _from_fields_v1(item, prefix + (key,))
        else:
            out.add(prefix + (key,))
    return out


def _to_fields_v1(paths: set[Path_]) -> Obj:
    root: Obj = {}
    for path in sorted(paths):
        node = root
        for key in path:
            node = node.setdefault(key, {})
    return root


def _track_fields(desired: Obj, current: Obj | None, manager: str, api_version: str) -> None:
    """Set `desired`'s managedFields for a write by `manager` over `current` (None: a create)."""
    meta = desired.setdefault("metadata", {})
    old_managed = (current or {}).get("metadata", {}).get("managedFields") or []
    sent = meta.get("managedFields")
    # A client that sends managedFields different from the stored ones replaces them (how they are reset).
    base = copy.deepcopy(sent if sent is not None and sent != old_managed else old_managed) or []
    new_paths = _paths(_tracked(desired))
    old_paths = _paths(_tracked(current)) if current is not None else {}
    changed = {p for p, v in new_paths.items() if p not in old_paths or old_paths[p] != v}
    removed = set(old_paths) - set(new_paths)
    if not changed and not removed:
        meta["managedFields"] = base
        if not base:
            meta.pop("managedFields", None)
        return
    entries: list[Obj] = []
    mine: set[Path_] = set()
    for entry in base:
        owned = _from_fields_v1(entry.get("fieldsV1"))
        if (entry.get("manager"), entry.get("operation"), entry.get("subresource")) == (manager, "Update", None):
            mine |= owned
            continue
        if entry.get("subresource") != "status":
            owned -= changed | removed
            if not owned:
                continue
            entry["fieldsV1"] = _to_fields_v1(owned)
        entries.append(entry)
    mine = (mine - removed) | changed
    entries.append({"manager": manager, "operation": "Update", "apiVersion": api_version, "time": _now(),
                    "fieldsType": "FieldsV1", "fieldsV1": _to_fields_v1(mine)})
    meta["managedFields"] = entries


__all__ = ["ApiError", "Fault", "Hook", "InvalidObject", "KubeEmulator", "RecordedRequest",
           "RESOURCES", "ResourceType", "WriteRecord", "merge_patch"]
