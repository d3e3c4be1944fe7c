"""Sandboxes: create, connect, list, exec, files, TTL, network, kill, fork, snapshot, pause, ports."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union, overload

from . import errors as _errors
from ._command import Command, Output, check_str_map, command_body
from .code_interpreter import (
    CodeContext,
    CodeRun,
    ContextArg,
    Execution,
    ResultCallback,
    code_body,
    code_context,
    code_contexts,
    code_wait,
    context_body,
    context_id,
    interrupt_body,
    interrupted,
)
from .client import Client, _create_event, _is_ndjson, _long, quote_segment, resolve_client
from .errors import ForkError, NotFoundError, PandaConnectionError, PandaError
from .filesystem import Filesystem
from .processes import Commands, Pty
from .models import ExecResult, NetworkPolicy, Port, SandboxInfo, SignedURL, VolumeMount, parse_time
from .snapshot import AsyncSnapshot, Snapshot
from .volume import VolumesArg, _volume_mode, _volumes_body

__all__ = ["Sandbox", "OutputCallback", "Command"]

#: Called with each piece of output (``str``) as it arrives.
OutputCallback = Callable[[str], Any]

# Extra seconds a client waits for an exec answer beyond the command's own timeout.
_EXEC_MARGIN = 30.0
_SERVER_DEFAULT_EXEC_TIMEOUT = 60.0


#: A network policy as :meth:`Sandbox.create` takes it: a dict with any of
#: ``internet`` (bool), ``allow_out`` and ``deny_out`` (lists of str), or a
#: :class:`NetworkPolicy`.
NetworkArg = Union[Mapping[str, Any], NetworkPolicy]

_NETWORK_KEYS = ("internet", "allow_out", "deny_out")


def _entries(name: str, v: Any) -> List[str]:
    # A bare str is iterable too: "pypi.org" would become one entry per character.
    if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
        raise TypeError("%s must be a list of str (IPv4 addresses, CIDRs or domain names), got %r" % (name, v))
    out = list(v)
    for e in out:
        if not isinstance(e, str):
            raise TypeError("every %s entry must be a str, got %r" % (name, e))
    return out


def _network_body(network: NetworkArg) -> Dict[str, Any]:
    """The API's NetworkPolicy object of a dict or NetworkPolicy; keys that are None are left out.

    Only types are checked here; the server checks the entries (a bad one
    raises :class:`BadRequestError` naming it).
    """
    if isinstance(network, NetworkPolicy):
        network = network.to_dict()
    if not isinstance(network, Mapping):
        raise TypeError("network must be a dict or a NetworkPolicy, got %r" % (network,))
    unknown = sorted(str(k) for k in network if k not in _NETWORK_KEYS)
    if unknown:
        raise ValueError("network has unknown keys %s (known: internet, allow_out, deny_out)" % ", ".join(unknown))
    body: Dict[str, Any] = {}
    internet = network.get("internet")
    if internet is not None:
        if not isinstance(internet, bool):
            raise TypeError("network internet must be True or False, got %r" % (internet,))
        body["internet"] = internet
    for k in ("allow_out", "deny_out"):
        if network.get(k) is not None:
            body[k] = _entries(k, network[k])
    return body


#: Where new sandboxes go, as :meth:`Sandbox.create` and :meth:`Sandbox.fork`
#: take it: ``None`` (the server chooses), ``"spread"`` (a fork's children
#: over as many hosts as possible) or ``{"host": host_id}`` (that host).
PlacementArg = Union[str, Mapping[str, str], None]

_PLACEMENT_FORMS = 'None, "spread" or {"host": HOST_ID}'


def _resume_body(placement: PlacementArg) -> Dict[str, Any]:
    """The body of a resume: its placement, if any."""
    body = _placement_body(placement)
    return {} if body is None else {"placement": body}


def _placement_body(placement: PlacementArg) -> Any:
    """The API's ``placement`` of a :data:`PlacementArg`, or ``None`` to leave it out; ValueError if it is none of the forms."""
    if placement is None or placement == "auto":
        return None
    if isinstance(placement, str):
        if placement == "spread":
            return "spread"
        raise ValueError("placement must be %s, got %r" % (_PLACEMENT_FORMS, placement))
    if isinstance(placement, Mapping):
        keys = set(placement)
        if keys == {"spread"}:
            raise ValueError('placement %r: write placement="spread"' % (placement,))
        if keys != {"host"}:
            raise ValueError("placement must be %s, got a dict with keys %s" % (_PLACEMENT_FORMS, sorted(repr(k) for k in keys)))
        host = placement["host"]
        if not isinstance(host, str) or not host:
            raise ValueError("placement host must be a host id (a non-empty str, e.g. a sandbox's info.host_id), got %r" % (host,))
        return {"host": host}
    raise ValueError("placement must be %s, got %r" % (_PLACEMENT_FORMS, placement))


def _fork_body(n: int, placement: PlacementArg, volumes: Optional[str] = None) -> Dict[str, Any]:
    """The body of ``POST /v1/sandboxes/{id}/fork``."""
    body: Dict[str, Any] = {"count": n}
    p = _placement_body(placement)
    if p is not None:
        body["placement"] = p
    mode = _volume_mode(volumes)
    if mode is not None:
        body["volume_mode"] = mode
    return body


def _create_body(
    template: Optional[str],
    snapshot: Any,
    ttl_seconds: Optional[int],
    memory_mib: Optional[int],
    vcpus: Optional[int],
    metadata: Optional[Mapping[str, str]],
    env: Optional[Mapping[str, str]],
    network: Optional[NetworkArg],
    on_expire: Optional[str] = None,
    placement: PlacementArg = None,
    volumes: Optional[VolumesArg] = None,
) -> Dict[str, Any]:
    """The body of ``POST /v1/sandboxes``; ``snapshot`` is an id or anything with an ``id`` (a sync or async snapshot)."""
    body: Dict[str, Any] = {}
    if template is not None:
        body["template"] = template
    if snapshot is not None:
        body["snapshot_id"] = snapshot.id if isinstance(snapshot, (Snapshot, AsyncSnapshot)) else snapshot
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    if memory_mib is not None:
        body["memory_mib"] = memory_mib
    if vcpus is not None:
        body["vcpus"] = vcpus
    md = check_str_map("metadata", metadata)
    if md is not None:
        body["metadata"] = md
    e = check_str_map("env", env)
    if e is not None:
        body["env"] = e
    if network is not None:
        body["network"] = _network_body(network)
    if on_expire is not None:
        if on_expire not in ("kill", "pause"):
            raise ValueError('on_expire must be "kill" or "pause", got %r' % (on_expire,))
        body["on_expire"] = on_expire
    p = _placement_body(placement)
    if p is not None:
        body["placement"] = p
    v = _volumes_body(volumes)
    if v is not None:
        body["volumes"] = v
    return body


def _list_query(state: Optional[str], metadata: Optional[Mapping[str, str]]) -> List[Tuple[str, str]]:
    query: List[Tuple[str, str]] = []
    if state is not None:
        query.append(("state", state))
    for k, v in (check_str_map("metadata", metadata) or {}).items():
        if "=" in k:
            raise ValueError("a metadata key used as a filter cannot contain '=': %r" % k)
        query.append(("metadata", "%s=%s" % (k, v)))
    return query


def _exec_body(
    cmd: Command,
    timeout_seconds: Optional[float],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    stdin: Union[str, bytes, None],
    user: Optional[str],
) -> Dict[str, Any]:
    body = command_body(cmd, env, cwd, user, timeout_seconds)
    if stdin is not None:
        body["stdin"] = stdin.decode("utf-8") if isinstance(stdin, (bytes, bytearray)) else stdin
    return body


def _exec_wait(client_timeout: Optional[float], timeout_seconds: Optional[float]) -> float:
    """Socket timeout for an exec: the command's own timeout plus a margin."""
    if timeout_seconds == 0 or client_timeout is None:
        return float("inf")
    t = _SERVER_DEFAULT_EXEC_TIMEOUT if timeout_seconds is None else float(timeout_seconds)
    return max(client_timeout, t + _EXEC_MARGIN)


def _exec_event(ev: Any) -> Tuple[Optional[str], str]:
    """One event of an exec stream: ``("stdout"|"stderr", text)``, ``("exit", "")``, or ``(None, "")`` to ignore; an error event raises."""
    if not isinstance(ev, Mapping):
        return None, ""
    t = ev.get("type")
    if t in ("stdout", "stderr"):
        return t, ev.get("data") or ""
    if t == "exit":
        return "exit", ""
    if t == "error":
        raise _errors.error_from_body(ev.get("error") or {})
    # "start" and unknown event types are ignored.
    return None, ""


def _exec_cut_message(sandbox_id: str) -> str:
    return "the exec stream of sandbox %s ended before the command's exit status (server restarted or connection cut)" % sandbox_id


def _fork_count(count: Optional[int]) -> int:
    n = 1 if count is None else count
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError("count must be a positive integer, got %r" % (count,))
    return n


def _fork_result(parent_id: str, cls: Any, client: Any, data: Any, count: Optional[int], n: int) -> Any:
    """The children of a fork answer as ``cls`` objects (one for ``count=None``, else a list), or the error to raise."""
    entries = (data or {}).get("children") if isinstance(data, Mapping) else None
    if not isinstance(entries, list):
        raise PandaError("the server's fork answer has no children list: %r" % (data,))
    children: List[Any] = []
    errs: List[PandaError] = []
    for entry in entries:
        if isinstance(entry, Mapping) and isinstance(entry.get("sandbox"), Mapping):
            children.append(cls(SandboxInfo.from_dict(entry["sandbox"]), client))
        elif isinstance(entry, Mapping) and entry.get("error") is not None:
            errs.append(_errors.error_from_body(entry["error"]))
        else:
            errs.append(PandaError("the server's fork answer has a malformed child: %r" % (entry,)))
    if len(children) + len(errs) != n:
        errs.append(PandaError("asked for %d children, the server answered %d" % (n, len(children) + len(errs))))
    if count is None:
        if children and not errs:
            return children[0]
        if errs and not children:
            raise errs[0]
        raise ForkError(
            "fork of %s: unexpected answer" % parent_id, children=children, errors=errs, code=errs[0].code if errs else None
        )
    if errs:
        first = errs[0]
        raise ForkError(
            "fork of %s: %d of %d children failed (first: %s)" % (parent_id, len(errs), n, first),
            children=children,
            errors=errs,
            status=first.status,
            code=first.code,
        )
    return children


def _url_body(port: int, ttl_seconds: Optional[int]) -> Dict[str, Any]:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError("port must be an integer from 1 to 65535, got %r" % (port,))
    body: Dict[str, Any] = {}
    if ttl_seconds is not None:
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds < 1:
            raise ValueError("ttl_seconds must be a positive integer, got %r" % (ttl_seconds,))
        body["ttl_seconds"] = ttl_seconds
    return body


def _signed_url(data: Any) -> SignedURL:
    url = data.get("url") if isinstance(data, Mapping) else None
    if not isinstance(url, str) or not url:
        raise PandaError("the server's answer has no url: %r" % (data,))
    return SignedURL(url, parse_time(data.get("expires_at")))


def _set_network_body(internet: Optional[bool], allow_out: Optional[Sequence[str]], deny_out: Optional[Sequence[str]]) -> Dict[str, Any]:
    body = _network_body({"internet": internet, "allow_out": allow_out, "deny_out": deny_out})
    if not body:
        raise ValueError("set_network needs at least one of internet, allow_out, deny_out")
    return body


def _snapshot_body(name: Optional[str]) -> Dict[str, Any]:
    return {} if name is None else {"name": name}


def _sandboxes(cls: Any, client: Any, data: Any) -> List[Any]:
    """The sandboxes of a ``GET /v1/sandboxes`` answer as ``cls`` objects."""
    return [cls(SandboxInfo.from_dict(s), client) for s in (data or {}).get("sandboxes") or []]


class _Described:
    """What :class:`Sandbox` and :class:`~pandastack.AsyncSandbox` share: the
    server's last description of the sandbox, and the paths of its API."""

    _info: SandboxInfo

    @property
    def id(self) -> str:
        """The sandbox id."""
        return self._info.id

    @property
    def info(self) -> SandboxInfo:
        """The server's description of the sandbox as of the last call that returned it (see :meth:`refresh`)."""
        return self._info

    @property
    def state(self) -> str:
        """Shortcut for ``info.state`` (not refreshed)."""
        return self._info.state

    @property
    def volumes(self) -> "List[VolumeMount]":
        """Shortcut for ``info.volumes``: the volumes it mounts (:class:`VolumeMount`: name, path, read_only)."""
        return self._info.volumes

    @property
    def network(self) -> Optional[NetworkPolicy]:
        """Shortcut for ``info.network``: the egress policy as the server last reported it (not refreshed).

        ``None`` from a server that reports none.
        """
        return self._info.network

    def _path(self, suffix: str) -> str:
        return "/v1/sandboxes/%s%s" % (quote_segment(self.id), suffix)

    def _update(self, data: Any) -> SandboxInfo:
        if isinstance(data, Mapping) and data:
            self._info = SandboxInfo.from_dict(data)
        return self._info


class Sandbox(_Described):
    """A microVM sandbox.

    Do not construct it directly: use :meth:`create`, :meth:`connect` or
    :meth:`list`. A sandbox keeps the :class:`Client` it was obtained with.

    Attributes:
        filesystem: File operations in this sandbox (:class:`Filesystem`).
        commands: Foreground and background commands (:class:`Commands`).
        pty: Terminals (:class:`Pty`).

    Example::

        from pandastack import Sandbox

        with Sandbox.create(template="tiny", ttl_seconds=600) as sb:
            print(sb.exec("uname -a").stdout)
    """

    def __init__(self, info: SandboxInfo, client: Client) -> None:
        self._info = info
        self._client = client
        self.filesystem: Filesystem = Filesystem(self)
        self.commands: Commands = Commands(self)
        self.pty: Pty = Pty(self)

    # -- constructors ------------------------------------------------------

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        ttl_seconds: Optional[int] = 3600,
        memory_mib: Optional[int] = None,
        vcpus: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        *,
        snapshot: Union[str, Snapshot, None] = None,
        network: Optional[NetworkArg] = None,
        on_expire: Optional[str] = None,
        placement: PlacementArg = None,
        volumes: Optional[VolumesArg] = None,
        client: Optional[Client] = None,
        on_progress: Optional[Callable[[str], None]] = None,
    ) -> "Sandbox":
        """Create a sandbox and return it running.

        Args:
            template: Template name (``"base"``, ``"tiny"``, or one built from
                an image with ``Template.from_image``...); for a template
                built from an image, ``"NAME"`` is its latest version and
                ``"NAME:3"`` pins version 3 (the sandbox's ``template`` says
                which it got, ``"NAME:N"``). ``None``: the server's default,
                ``base``. Leave it out with ``snapshot``.
            ttl_seconds: Seconds until the sandbox is killed (at most the server's
                max TTL); extend it later with :meth:`set_ttl`. ``None``: the
                server's default (300).
            memory_mib: Guest memory (server default 1024). A template is baked
                once per memory size, so the first create of a new size is slow.
            vcpus: Guest vCPUs (server default 1).
            metadata: Labels (str to str), filterable with :meth:`list`.
            env: Default environment of every command run in the sandbox.
            api_key: API key for this sandbox (default ``PANDASTACK_API_KEY``).
            api_url: Server URL (default ``PANDASTACK_API_URL`` or ``http://127.0.0.1:7788``).
            snapshot: Start from this snapshot (a :class:`Snapshot` or its id)
                instead of a template.
            network: Its egress policy, a dict like ``{"internet": False,
                "allow_out": ["pypi.org"], "deny_out": []}`` (keys left out:
                ``internet`` on, empty lists) or a :class:`NetworkPolicy`.
                ``None``: the server's default, the internet allowed. Change
                it later with :meth:`set_network`.
            on_expire: What the end of the TTL does: ``"kill"`` (``None``:
                the server's default, kill) or ``"pause"`` (see
                :meth:`pause`; :meth:`resume` gives it its TTL again).
            placement: The host to run on, ``{"host": host_id}`` (a host of
                the fleet, e.g. another sandbox's ``info.host_id``).
                ``None``: the server chooses — the host that already holds
                the template's memory image, then the one with the most free
                memory (see docs/scheduling.md). ``info.host_id`` says where
                it went.
            volumes: Volumes to mount: ``{"/mnt/data": vol}`` (a
                :class:`Volume` or its name, by the path the sandbox sees
                it at), or ``[{"name": "data", "path": "/mnt/data",
                "read_only": True}]``. At most 8; paths absolute, not ``/``,
                not under ``/proc``, ``/sys`` or ``/dev``, none inside
                another. The sandbox runs on the volumes' host. See
                docs/volumes.md.
            client: Use this :class:`Client` instead of ``api_key``/``api_url``.
            on_progress: Called with each step of what the create does before
                the sandbox starts, as it happens: fetching its template to the
                host, baking it (the first create of a memory size, or of a
                user template on a host, can take tens of seconds). Never
                called by a server that does not report it.

        Raises:
            ValueError: ``on_expire`` is neither ``"kill"`` nor ``"pause"``;
                ``placement`` is not ``None``, ``"spread"`` or ``{"host": ...}``;
                a malformed ``volumes`` entry.
            BadRequestError: a bad ``network`` or ``volumes`` entry (the message names it).
            NotFoundError: unknown template, snapshot or volume.
            ConflictError: the volumes live on different hosts.
            InvalidArgumentError: a value out of range (e.g. TTL over the max).
            QuotaExceededError: over the key's sandbox or memory quota.
            InsufficientStorageError: the host is out of disk.
            PandaError: the ``placement`` host is unknown, draining or lost,
                or has no room (the message says which).

        Example::

            sb = Sandbox.create(template="tiny", memory_mib=256, metadata={"job": "42"})
        """
        c = resolve_client(client, api_key, api_url)
        body = _create_body(template, snapshot, ttl_seconds, memory_mib, vcpus, metadata, env, network, on_expire, placement, volumes)
        if on_progress is None:
            data = c.request_json("POST", "/v1/sandboxes", json_body=body, timeout=_long(c.timeout))
            return cls(SandboxInfo.from_dict(data or {}), c)
        with c.stream("POST", "/v1/sandboxes", query={"progress": "1"}, json_body=body, timeout=_long(c.timeout)) as resp:
            if not _is_ndjson(resp.headers):
                return cls(SandboxInfo.from_dict(json.loads(b"".join(resp.iter_chunks()) or b"{}")), c)
            for ev in resp.iter_ndjson():
                progress, done = _create_event(ev)
                if progress is not None:
                    on_progress(progress)
                elif done is not None:
                    return cls(SandboxInfo.from_dict(done), c)
        raise PandaConnectionError("the create stream ended before the sandbox was created")

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        *,
        client: Optional[Client] = None,
    ) -> "Sandbox":
        """Attach to an existing sandbox by id.

        Raises :class:`NotFoundError` if it does not exist or belongs to another key.

        Example::

            sb = Sandbox.connect("k3v9q2m8x7c1b5n4z6a0")
        """
        c = resolve_client(client, api_key, api_url)
        data = c.request_json("GET", "/v1/sandboxes/%s" % quote_segment(sandbox_id))
        return cls(SandboxInfo.from_dict(data or {}), c)

    @classmethod
    def list(
        cls,
        state: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        *,
        client: Optional[Client] = None,
    ) -> "List[Sandbox]":
        """List your sandboxes, oldest first.

        Args:
            state: Only sandboxes in this state (``"running"``, ``"paused"``,
                ``"stopped"``...). Without it, stopped sandboxes are left out.
            metadata: Only sandboxes whose metadata has all these pairs.

        Example::

            for sb in Sandbox.list(metadata={"job": "42"}):
                sb.kill()
        """
        c = resolve_client(client, api_key, api_url)
        return _sandboxes(cls, c, c.request_json("GET", "/v1/sandboxes", query=_list_query(state, metadata)))

    # -- properties (id, info, state and network: _Described's) ---------------

    @property
    def client(self) -> Client:
        """The client this sandbox's requests go through."""
        return self._client

    # -- lifecycle -------------------------------------------------------------

    def refresh(self) -> SandboxInfo:
        """Re-read the sandbox from the server, update :attr:`info` and return it.

        A killed sandbox stays visible for a while with ``state == "stopped"``;
        after that this raises :class:`NotFoundError`.
        """
        return self._update(self._client.request_json("GET", self._path("")))

    def set_ttl(self, seconds: int) -> SandboxInfo:
        """Set the time to live to ``seconds`` from now (at most the server's max TTL).

        Updates and returns :attr:`info` (see ``info.expires_at``).

        Example::

            sb.set_ttl(3600)  # one more hour from now
        """
        body = self._client.request_json("PUT", self._path("/ttl"), json_body={"ttl_seconds": seconds})
        return self._update(body)

    def set_network(
        self,
        *,
        internet: Optional[bool] = None,
        allow_out: Optional[Sequence[str]] = None,
        deny_out: Optional[Sequence[str]] = None,
    ) -> Optional[NetworkPolicy]:
        """Change the sandbox's egress policy: each argument given replaces that part, the others stay.

        ``internet=False`` denies everything but ``allow_out``;
        ``internet=True`` allows everything but ``deny_out``; ``allow_out``
        wins over ``deny_out``; an empty list empties that list (see
        :class:`NetworkPolicy` for the entries). A running sandbox's rules
        change at once (established connections stay up); a paused one's when
        it resumes. Updates :attr:`info` and returns the resulting policy.

        Raises:
            BadRequestError: a bad entry (the message names it).
            ConflictError: the sandbox is stopped.

        Example::

            sb.set_network(internet=False, allow_out=["pypi.org", "files.pythonhosted.org"])
            sb.set_network(deny_out=[])  # internet and allow_out stay
        """
        body = _set_network_body(internet, allow_out, deny_out)
        self._update(self._client.request_json("PATCH", self._path("/network"), json_body=body))
        return self._info.network

    def kill(self) -> None:
        """Kill the sandbox and free what it used. Killing an already killed or expired sandbox is not an error."""
        try:
            self._client.request("DELETE", self._path(""))
        except NotFoundError:
            pass

    def pause(self) -> SandboxInfo:
        """Pause the sandbox to the server's disk. Updates and returns :attr:`info`.

        The VM's memory and device state are captured to disk next to its
        disk (on stable storage, with checksums) and its VMM stops: a paused
        sandbox holds no host memory and does not expire; :meth:`resume`
        restores the capture, processes and all. Commands and file operations on a paused sandbox raise
        :class:`ConflictError`. If this call times out or the connection breaks,
        the pause still completes on the server: :meth:`refresh` tells how it
        ended (``state``, ``last_error``).
        """
        return self._update(
            self._client.request_json("POST", self._path("/pause"), json_body={}, timeout=_long(self._client.timeout))
        )

    def resume(self, *, placement: PlacementArg = None) -> SandboxInfo:
        """Resume a paused sandbox where it was. Updates and returns :attr:`info`.

        On a fleet, ``placement={"host": host_id}`` resumes it on another host,
        which fetches its saved state from the object store the hosts share
        (``info.host_id`` is then that host).

        A new VMM restores the saved memory and device state; the TTL starts
        again.

        If this call times out or the connection breaks, the resume still
        completes on the server (:meth:`refresh`). If the restore fails the
        sandbox stays paused with its saved state (``info.last_error`` says
        why) and can be resumed again; saved files that fail their checksums
        raise :class:`CorruptError`.
        """
        return self._update(
            self._client.request_json("POST", self._path("/resume"), json_body=_resume_body(placement), timeout=_long(self._client.timeout))
        )

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.kill()
            return
        # Do not hide the exception that ended the block behind a kill failure.
        try:
            self.kill()
        except PandaError:
            pass

    # -- fork and snapshot ---------------------------------------------------

    @overload
    def fork(self, count: None = None, placement: PlacementArg = None, *, volumes: Optional[str] = None) -> "Sandbox": ...

    @overload
    def fork(self, count: int, placement: PlacementArg = None, *, volumes: Optional[str] = None) -> "List[Sandbox]": ...

    def fork(self, count: Optional[int] = None, placement: PlacementArg = None, *, volumes: Optional[str] = None) -> "Union[Sandbox, List[Sandbox]]":
        """Fork this running sandbox into live copies that continue from its current state.

        The parent is paused for the copy (milliseconds) and then continues.
        Children share the parent's memory and disk copy-on-write; each gets
        fresh randomness, the current clock and its own identity. Network
        connections open in the parent are dead in the children.

        ``fork()`` returns one :class:`Sandbox` (and raises the error of that
        child if it could not be created). ``fork(count=n)`` returns a list of
        ``n``; if some children failed it raises :class:`ForkError`, whose
        ``children`` are the ones created (running, yours to use or kill) and
        whose ``errors`` are the failures.

        ``placement`` says where the children run: ``None`` keeps them on
        this sandbox's host while it has room (nothing to copy between
        hosts); ``"spread"`` puts them round-robin over the fleet's hosts,
        this one first; ``{"host": host_id}`` puts them all on that host.
        Each child's ``info.host_id`` says where it went. A bad ``placement``
        raises ValueError before anything is sent.

        ``volumes`` says what the children mount of this sandbox's volumes:
        ``None`` or ``"share"``, the same volumes (every write is seen by
        all); ``"branch"``, each child a copy of each volume of its own,
        named ``<volume>-<child id>``, cloned while the parent is stopped for
        the fork (copy-on-write on the host). A branch outlives its child
        until deleted, or promoted over its parent with
        :meth:`Volume.promote`; it counts in your disk quota.

        Example::

            children = sb.fork(count=4)
            results = [c.exec("python3 try.py --seed %d" % i) for i, c in enumerate(children)]
            spread = sb.fork(count=3, placement="spread")
        """
        n = _fork_count(count)
        body = _fork_body(n, placement, volumes)
        data = self._client.request_json("POST", self._path("/fork"), json_body=body, timeout=_long(self._client.timeout))
        return _fork_result(self.id, Sandbox, self._client, data, count, n)

    def snapshot(self, name: Optional[str] = None) -> Snapshot:
        """Save this sandbox (memory, device state and disk) as a :class:`Snapshot`; the sandbox keeps running.

        Example::

            snap = sb.snapshot(name="after-setup")
            other = Sandbox.create(snapshot=snap.id)
        """
        data = self._client.request_json("POST", self._path("/snapshots"), json_body=_snapshot_body(name), timeout=_long(self._client.timeout))
        return Snapshot(data or {}, self._client)

    # -- exec ----------------------------------------------------------------

    def exec(
        self,
        cmd: Command,
        timeout_seconds: Optional[float] = 60,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        user: Optional[str] = None,
    ) -> ExecResult:
        """Run a command and wait for it to end.

        Args:
            cmd: A shell command line (``"ls -l | wc -l"``, run with
                ``bash -l -c``, a login bash whose profiles do not override
                ``env``, or ``/bin/sh -c`` in a sandbox without ``/bin/bash``) or an argv list (``["ls", "-l"]``, run directly,
                looked up in ``PATH``).
            timeout_seconds: Kill the command's process group after this long
                (``result.timed_out`` is then ``True``); ``0`` means no timeout;
                ``None`` means the server's default (60).
            env: Extra environment variables (over the sandbox's ``env``).
            cwd: Working directory, absolute (default the user's home if it
                exists, else ``/``; ``/root`` for root).
            stdin: Text fed to standard input (bytes must be UTF-8).
            on_stdout: Called with each chunk of standard output (``str``) as
                it is produced. With either callback the command runs through
                the streaming endpoint; the full output is still returned.
            on_stderr: Same for standard error.
            user: Run as this user instead of root, written as Docker's
                ``USER``: ``"name"``, ``"uid"``, ``"name:group"`` or
                ``"uid:gid"``. Names are looked up in the sandbox's
                ``/etc/passwd`` and ``/etc/group`` (an unknown one raises
                :class:`NotFoundError`). Default: the template image's user,
                else root.

        Returns:
            An :class:`ExecResult`. A non-zero exit is not an exception: check
            ``result.exit_code`` (or ``result.ok``).

        Raises:
            NotFoundError: the sandbox is gone, or the executable of an argv list does not exist.
            ConflictError: the sandbox is not running (paused or stopped).

        Example::

            r = sb.exec("echo hi && echo oops >&2; exit 3")
            assert (r.stdout, r.stderr, r.exit_code) == ("hi\\n", "oops\\n", 3)
            sb.exec("pip install -r requirements.txt", timeout_seconds=600, on_stdout=print)
        """
        body = _exec_body(cmd, timeout_seconds, env, cwd, stdin, user)
        wait = self._exec_wait(timeout_seconds)
        if on_stdout is None and on_stderr is None:
            data = self._client.request_json("POST", self._path("/exec"), json_body=body, timeout=wait)
            return ExecResult.from_dict(data or {})
        return self._exec_stream(body, wait, on_stdout, on_stderr)

    def _exec_wait(self, timeout_seconds: Optional[float]) -> float:
        """Socket timeout for an exec: the command's own timeout plus a margin."""
        return _exec_wait(self._client.timeout, timeout_seconds)

    def _exec_stream(
        self,
        body: Dict[str, Any],
        wait: float,
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
    ) -> ExecResult:
        got = Output(on_stdout, on_stderr)
        with self._client.stream("POST", self._path("/exec/stream"), json_body=body, timeout=wait, headers={"Accept": "application/x-ndjson"}) as resp:
            for ev in resp.iter_ndjson():
                kind, s = _exec_event(ev)
                if kind == "exit":
                    return got.result(ExecResult.from_dict(ev))
                if kind is not None:
                    cb = got.add(kind, s)
                    if cb is not None:
                        cb(s)
        raise PandaConnectionError(_exec_cut_message(self.id))

    # -- code interpreter ----------------------------------------------------

    def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        context: Optional[ContextArg] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_result: Optional[ResultCallback] = None,
        envs: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Execution:
        """Run a cell of code in a live interpreter of the sandbox and wait for it to end.

        The sandbox must come from the ``code-interpreter`` template.
        Variables, imports and the working directory persist from one cell
        to the next of a context.

        Args:
            code: The cell's code.
            language: ``"python"`` (the default), ``"javascript"`` or
                ``"bash"`` (also ``"py"``, ``"js"``, ``"node"``, ``"sh"``...):
                runs in that language's default context.
            context: A :class:`CodeContext` (or its id) to run in, from
                :meth:`create_code_context`. Not with ``language``.
            on_stdout: Called with each piece of standard output (``str``) as it comes.
            on_stderr: Same for standard error.
            on_result: Called with each :class:`Result` (a chart, a table...) as it comes.
                The callbacks are called in the order of the cell's output; an
                exception in one ends the call (and interrupts the cell).
            envs: Environment variables for this cell only.
            timeout: Interrupt the cell after this many seconds (at most 3600;
                ``None``: the server's default, 300), time waiting behind
                other cells of the context included. ``execution.error.name``
                is then ``"TimeoutError"``; the context and its variables live on.

        Returns:
            An :class:`Execution`. An exception in the cell is not raised:
            it is ``execution.error`` (:class:`ExecutionError`).

        Raises:
            ValueError: both ``language`` and ``context``; a bad ``timeout``.
            BadRequestError: an unknown language.
            NotFoundError: the sandbox or the context does not exist.
            ConflictError: the sandbox is not running.
            TooManyRequestsError: too many requests or connections in flight on the sandbox.
            PandaError: ``code == "guest_error"``: the sandbox has no code
                interpreter (not made from the ``code-interpreter``
                template) or its code server failed during the cell;
                ``"not_implemented"``: the server reaches sandboxes through
                their guest agents and this one's is too old (recreate the sandbox).
            PandaConnectionError: the stream was cut before the cell ended.

        Closing the connection (an exception in a callback, ``KeyboardInterrupt``)
        interrupts the cell.

        Example::

            sb.run_code("import pandas as pd; df = pd.DataFrame({'x': [1, 2, 3]})")
            print(sb.run_code("df.x.sum()").text)  # 6
            ex = sb.run_code("import matplotlib.pyplot as plt; plt.plot(df.x); plt.show()")
            png = ex.results[0].png  # the chart's bytes
        """
        body = code_body(code, language, context, envs, timeout)
        run = CodeRun(self.id, on_stdout, on_stderr, on_result)
        wait = code_wait(self._client.timeout, body)
        with self._client.stream("POST", self._path("/code"), json_body=body, timeout=wait, headers={"Accept": "application/x-ndjson"}) as resp:
            events = resp.iter_ndjson()
            while True:
                try:
                    ev = next(events)
                except StopIteration:
                    break
                except ValueError as e:
                    raise run.malformed_line(e) from e
                call = run.add(ev)
                if call is not None:
                    call[0](call[1])
                if run.done:
                    return run.execution()
        return run.unfinished()

    def create_code_context(self, language: Optional[str] = None, cwd: Optional[str] = None) -> CodeContext:
        """Start a new interpreter (context) with its own state.

        Args:
            language: ``"python"`` (the default), ``"javascript"`` or ``"bash"``.
            cwd: Its working directory (default ``/home/user``); must exist.

        A Python context imports numpy, pandas and matplotlib as it starts,
        which takes seconds: this call waits for it (as long as a create).

        Raises:
            BadRequestError: an unknown language, or ``cwd`` is no directory.

        Example::

            ctx = sb.create_code_context(cwd="/tmp")
            sb.run_code("x = 1", context=ctx)
        """
        body = context_body(language, cwd)
        return code_context(self._client.request_json("POST", self._path("/code/contexts"), json_body=body, timeout=_long(self._client.timeout)))

    def list_code_contexts(self) -> List[CodeContext]:
        """The sandbox's contexts, the default one of each language started so far included."""
        return code_contexts(self._client.request_json("GET", self._path("/code/contexts")))

    def restart_code_context(self, context: ContextArg) -> CodeContext:
        """Replace the context's interpreter with a fresh one (same id, language and cwd; its variables are gone).

        What to do after a cell killed the interpreter (``execution.error.name == "KernelDied"``).
        Raises :class:`NotFoundError` for an unknown context.
        """
        cid = context_id(context)
        path = self._path("/code/contexts/%s/restart" % quote_segment(cid))
        return code_context(self._client.request_json("POST", path, timeout=_long(self._client.timeout)))

    def remove_code_context(self, context: ContextArg) -> None:
        """Stop the context's interpreter and forget it. Raises :class:`NotFoundError` for an unknown context.

        A language's default context may be removed too: the next cell in that
        language starts a new one.
        """
        cid = context_id(context)
        self._client.request("DELETE", self._path("/code/contexts/%s" % quote_segment(cid)))

    def interrupt_code(self, context: Optional[ContextArg] = None) -> bool:
        """Interrupt the cell running in ``context`` (default: Python's default context), as Ctrl-C would.

        The cell ends with ``execution.error.name == "KeyboardInterrupt"``; the
        context lives on. Returns whether a cell was running.
        """
        return interrupted(self._client.request_json("POST", self._path("/code/interrupt"), json_body=interrupt_body(context)))

    # -- ports -----------------------------------------------------------------

    def ports(self) -> "List[Port]":
        """List the TCP ports listening in the running sandbox (IPv4 and IPv6), sorted by port.

        A server must listen on every address (``0.0.0.0`` or ``::``), not only
        on 127.0.0.1, to be reached through :meth:`get_url`.

        Example::

            sb.exec("cd /work && (setsid python3 -m http.server 8000 >/dev/null 2>&1 &)")
            print([p.port for p in sb.ports()])  # [8000]
        """
        data = self._client.request_json("GET", self._path("/ports")) or {}
        return [Port.from_dict(p) for p in data.get("ports") or [] if isinstance(p, Mapping)]

    def get_url(self, port: int, ttl_seconds: Optional[int] = None) -> SignedURL:
        """Sign a URL that reaches ``port`` of this sandbox without an API key.

        The URL works for any path under it, any method and WebSockets, until
        it expires (``ttl_seconds``, default one hour on the server, at most
        its max TTL) and while the sandbox runs. Anyone with the URL can use
        it. It is returned as a :class:`SignedURL`: a ``str`` with
        ``expires_at``.

        Raises:
            InvalidArgumentError: port not in 1-65535, or ttl out of range.
            ConflictError: the sandbox is stopped.

        Example::

            url = sb.get_url(8000, ttl_seconds=600)
            print("open", url, "until", url.expires_at)
        """
        body = _url_body(port, ttl_seconds)
        data = self._client.request_json("POST", self._path("/ports/%d/url" % port), json_body=body) or {}
        return _signed_url(data)

    # -- misc ------------------------------------------------------------------

    def __repr__(self) -> str:
        return "Sandbox(id=%r, template=%r, state=%r)" % (self.id, self._info.template, self._info.state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("Sandbox", self.id))
