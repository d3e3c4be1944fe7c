"""Plain data returned by the API, as dataclasses.

Each class has a ``from_dict`` that accepts the JSON object of the API
(api/openapi.yaml) and ignores fields it does not know, so that a newer
server does not break an older SDK; the object as received is kept in
``raw``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional

if TYPE_CHECKING:  # pragma: no cover
    from .templates import TemplateBuilder

__all__ = ["SandboxInfo", "MemoryUsage", "NetworkPolicy", "ExecResult", "FileInfo", "Template", "APIKey", "Port", "SignedURL", "parse_time"]

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:?\d{2})?$"
)


def parse_time(value: Any) -> Optional[datetime]:
    """Parse an RFC 3339 timestamp as the API sends it (``2024-05-01T12:00:00.123456789Z``).

    Returns a timezone-aware :class:`datetime` (UTC when the string says
    ``Z``), or ``None`` for ``None``/empty input or a string that is not a
    timestamp. Fractions finer than a microsecond are truncated.
    """
    if not isinstance(value, str) or not value:
        return None
    m = _RFC3339.match(value.strip())
    if not m:
        return None
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    frac = m.group(7) or ""
    micro = int((frac + "000000")[:6]) if frac else 0
    tz_s = m.group(8)
    tz: timezone = timezone.utc
    if tz_s and tz_s not in ("Z", "z"):
        sign = 1 if tz_s[0] == "+" else -1
        digits = tz_s[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    try:
        return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)
    except ValueError:
        return None


def _int(v: Any, default: int = 0) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return int(v)
    return default


def _opt_int(v: Any) -> Optional[int]:
    return None if v is None else _int(v)


def _str(v: Any, default: str = "") -> str:
    return v if isinstance(v, str) else default


def _opt_str(v: Any) -> Optional[str]:
    return v if isinstance(v, str) and v != "" else None


def _str_map(v: Any) -> Dict[str, str]:
    if not isinstance(v, Mapping):
        return {}
    return {str(k): str(x) for k, x in v.items()}


def _mib_fields(d: Mapping[str, Any]) -> "Callable[[str], float]":
    def f(k: str) -> float:
        v = d.get(k)
        return float(v) if isinstance(v, (int, float)) else 0.0

    return f


@dataclass(frozen=True)
class LazyMemory:
    """What of a lazily paged memory image its host has read and fetched so far.

    Set on :class:`MemoryUsage` when the sandbox's memory is paged in from the
    object store on first touch (a host restoring a snapshot or paused sandbox
    it did not hold, with lazy restore on). The figures are the image's on its
    host, shared by every sandbox there restored from the same set.

    Attributes:
        image_mib: Size of the memory image.
        read_mib: What the host's kernel read of it (page faults, readahead).
        fetched_mib: What came from the object store (whole 2 MiB chunks).
        local_mib: What came from the host's copy of the template instead.
    """

    image_mib: float
    read_mib: float
    fetched_mib: float
    local_mib: float

    @classmethod
    def from_dict(cls, d: Any) -> "Optional[LazyMemory]":
        if not isinstance(d, Mapping):
            return None
        f = _mib_fields(d)
        return cls(image_mib=f("image_mib"), read_mib=f("read_mib"), fetched_mib=f("fetched_mib"), local_mib=f("local_mib"))


@dataclass(frozen=True)
class MemoryUsage:
    """Host memory a running sandbox uses, as the server measured it.

    Attributes:
        private_mib: Memory only this sandbox uses (pages it wrote).
        shared_mib: Memory shared with other sandboxes (template or fork base).
        pss_mib: Proportional set size: private plus its share of shared pages.
        lazy: For a memory image paged in lazily, what of it was read and
            fetched so far; ``None`` otherwise.
    """

    private_mib: float
    shared_mib: float
    pss_mib: float
    lazy: Optional[LazyMemory] = None

    @classmethod
    def from_dict(cls, d: Any) -> "Optional[MemoryUsage]":
        """Build from the ``memory`` object of a sandbox, or return ``None`` if there is none."""
        if not isinstance(d, Mapping):
            return None
        f = _mib_fields(d)
        return cls(private_mib=f("private_mib"), shared_mib=f("shared_mib"), pss_mib=f("pss_mib"), lazy=LazyMemory.from_dict(d.get("lazy")))


def _str_list(v: Any) -> List[str]:
    if not isinstance(v, list):
        return []
    return [x for x in v if isinstance(x, str)]


@dataclass(frozen=True)
class NetworkPolicy:
    """A sandbox's egress policy: what the sandbox may connect to.

    Entries of ``allow_out`` and ``deny_out`` are IPv4 addresses
    (``"203.0.113.7"``), CIDRs (``"203.0.113.0/24"``), domain names
    (``"example.com"``, exactly that name) or wildcards (``"*.example.com"``,
    the names below it). ``internet=True`` allows everything but
    ``deny_out``; ``internet=False`` denies everything but ``allow_out``;
    ``allow_out`` wins over ``deny_out``. Whatever the policy, the server
    blocks the host, other sandboxes, link-local addresses (cloud metadata)
    and the host's private networks unless its operator allowed them. Names
    are enforced by the sandbox's DNS resolver: a denied name does not
    resolve, an allowed name's addresses are allowed for their DNS TTL.

    Attributes:
        internet: Allow the internet (the default) or deny it.
        allow_out: Entries allowed whatever ``internet`` and ``deny_out`` say.
        deny_out: Entries denied (when ``internet`` is on).
    """

    internet: bool = True
    allow_out: List[str] = field(default_factory=list)
    deny_out: List[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: Any) -> "Optional[NetworkPolicy]":
        """Build from the API's ``NetworkPolicy`` object, or return ``None`` if there is none."""
        if not isinstance(d, Mapping):
            return None
        return cls(
            internet=bool(d.get("internet", True)),
            allow_out=_str_list(d.get("allow_out")),
            deny_out=_str_list(d.get("deny_out")),
        )

    def to_dict(self) -> Dict[str, Any]:
        """The API's ``NetworkPolicy`` object."""
        return {"internet": self.internet, "allow_out": list(self.allow_out), "deny_out": list(self.deny_out)}


@dataclass(frozen=True)
class SandboxInfo:
    """The server's description of a sandbox (the API's ``Sandbox`` object).

    Attributes:
        id: Sandbox id (lowercase letters and digits).
        template: Template it was created from.
        state: ``"starting"``, ``"running"``, ``"pausing"``, ``"paused"``,
            ``"resuming"``, ``"stopping"``, ``"stopped"``, or ``"lost"`` (its
            host stopped heartbeating, on a fleet; it is back as it was when
            the host returns). Only running sandboxes take commands and expire.
        memory_mib: Guest memory in MiB.
        vcpus: Guest vCPUs.
        created_at: When it was created (UTC), or ``None`` if the server sent no time.
        expires_at: When its TTL runs out, or ``None``.
        ttl_seconds: The TTL it was last given, if the server reports it.
        on_expire: What the end of its TTL does: ``"kill"`` or ``"pause"``
            (``None`` from a server that does not say).
        metadata: Labels given at creation.
        host_id: Host that runs it.
        stop_reason: Why a stopped sandbox stopped (``killed``, ``expired``...).
        last_error: The last operation that failed and left the sandbox as it
            was, e.g. a resume that left it paused.
        parent_id: The sandbox it was forked from, if any.
        snapshot_id: The snapshot it was created from, if any.
        network: Its egress policy (:class:`NetworkPolicy`), or ``None`` from
            a server that reports none.
        network_off: Its host runs without sandbox networking (``--network
            off``): the guest reaches nothing whatever ``network`` says (the
            policy applies if it resumes on a host with networking).
        memory: Host memory it uses, when the server reports it (running sandboxes).
        stored: A paused sandbox's saved state: ``"local"`` (its host's disk
            only), ``"uploading"`` or ``"durable"`` (in the object store: it
            can resume on another host); ``None`` otherwise.
        store_error: Why the last upload of that state failed, if it did.
        volumes: The volumes it mounts (:class:`VolumeMount`), in the order
            they were given at creation; empty if none.
        raw: The JSON object as received.
    """

    id: str
    template: str
    state: str
    memory_mib: int
    vcpus: int
    created_at: Optional[datetime]
    expires_at: Optional[datetime] = None
    ttl_seconds: Optional[int] = None
    metadata: Dict[str, str] = field(default_factory=dict)
    host_id: Optional[str] = None
    stop_reason: Optional[str] = None
    last_error: Optional[str] = None
    parent_id: Optional[str] = None
    snapshot_id: Optional[str] = None
    network: Optional[NetworkPolicy] = None
    memory: Optional[MemoryUsage] = field(default=None, compare=False)
    on_expire: Optional[str] = None
    stored: Optional[str] = None
    store_error: Optional[str] = None
    network_off: bool = False
    volumes: List["VolumeMount"] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SandboxInfo":
        """Build from the API's ``Sandbox`` JSON object."""
        return cls(
            id=_str(d.get("id")),
            template=_str(d.get("template")),
            state=_str(d.get("state")),
            memory_mib=_int(d.get("memory_mib")),
            vcpus=_int(d.get("vcpus")),
            created_at=parse_time(d.get("created_at")),
            expires_at=parse_time(d.get("expires_at")),
            ttl_seconds=_opt_int(d.get("ttl_seconds")),
            metadata=_str_map(d.get("metadata")),
            host_id=_opt_str(d.get("host_id")),
            stop_reason=_opt_str(d.get("stop_reason")),
            last_error=_opt_str(d.get("last_error")),
            parent_id=_opt_str(d.get("parent_id")),
            snapshot_id=_opt_str(d.get("snapshot_id")),
            network=NetworkPolicy.from_dict(d.get("network")),
            memory=MemoryUsage.from_dict(d.get("memory")),
            on_expire=_opt_str(d.get("on_expire")),
            stored=_opt_str(d.get("stored")),
            store_error=_opt_str(d.get("store_error")),
            network_off=d.get("network_off") is True,
            volumes=VolumeMount.list_from(d.get("volumes")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class VolumeMount:
    """A volume a sandbox mounts (an entry of :attr:`SandboxInfo.volumes`).

    Attributes:
        name: The volume's name.
        path: Where the sandbox sees it (an absolute path).
        read_only: The sandbox cannot change it.
    """

    name: str
    path: str
    read_only: bool

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "VolumeMount":
        """Build from an entry of the API's ``Sandbox.volumes``."""
        return cls(name=_str(d.get("name")), path=_str(d.get("path")), read_only=d.get("read_only") is True)

    @classmethod
    def list_from(cls, v: Any) -> "List[VolumeMount]":
        """The mounts of a sandbox JSON's ``volumes`` (an empty list for anything but a list)."""
        if not isinstance(v, list):
            return []
        return [cls.from_dict(m) for m in v if isinstance(m, Mapping)]


@dataclass(frozen=True)
class ExecResult:
    """How a command ended and what it printed.

    Attributes:
        exit_code: Exit status, or 128+N when killed by signal N.
        stdout: Standard output as text (invalid UTF-8 replaced).
        stderr: Standard error as text.
        duration_ms: Wall time of the command in the guest.
        signal: Name of the signal that killed it (``"SIGKILL"``), or ``None``.
        timed_out: The command was killed because ``timeout_seconds`` ran out.
        truncated: stdout or stderr went over the server's limit (16 MiB) and was cut
            (buffered exec only; streamed exec never truncates).
    """

    exit_code: int
    stdout: str
    stderr: str
    duration_ms: int
    signal: Optional[str] = None
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """``True`` when the command exited with status 0."""
        return self.exit_code == 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], stdout: Optional[str] = None, stderr: Optional[str] = None) -> "ExecResult":
        """Build from an ``ExecResult`` object or a stream's ``exit`` event.

        ``stdout``/``stderr`` override the object's fields (a stream's exit
        event carries no output).
        """
        return cls(
            exit_code=_int(d.get("exit_code")),
            stdout=_str(d.get("stdout")) if stdout is None else stdout,
            stderr=_str(d.get("stderr")) if stderr is None else stderr,
            duration_ms=_int(d.get("duration_ms")),
            signal=_opt_str(d.get("signal")),
            timed_out=bool(d.get("timed_out", False)),
            truncated=bool(d.get("truncated", False)),
        )


@dataclass(frozen=True)
class FileInfo:
    """A file or directory in a sandbox.

    Attributes:
        name: Base name.
        path: Absolute path.
        size: Size in bytes.
        mode: Permission bits (``0o644``; ``oct(info.mode)`` to print).
        is_dir: It is a directory.
        is_symlink: It is a symbolic link (stat does not follow a final symlink).
        link_target: Where the symlink points, or ``None``.
        modified_at: Last modification time, or ``None``.
        raw: The JSON object as received.
    """

    name: str
    path: str
    size: int
    mode: int
    is_dir: bool
    is_symlink: bool = False
    link_target: Optional[str] = None
    modified_at: Optional[datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FileInfo":
        """Build from the API's ``FileInfo`` JSON object."""
        return cls(
            name=_str(d.get("name")),
            path=_str(d.get("path")),
            size=_int(d.get("size")),
            mode=_int(d.get("mode")),
            is_dir=bool(d.get("is_dir", False)),
            is_symlink=bool(d.get("is_symlink", False)),
            link_target=_opt_str(d.get("link_target")),
            modified_at=parse_time(d.get("modified_at")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Port:
    """A TCP port listening in a sandbox.

    Attributes:
        port: The port number.
        address: The address it listens on: ``"0.0.0.0"`` or ``"::"`` for every
            address (only those are reachable through the server), ``"127.0.0.1"``...
    """

    port: int
    address: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Port":
        """Build from the API's ``ListeningPort`` JSON object."""
        return cls(port=_int(d.get("port")), address=_str(d.get("address")))


class SignedURL(str):
    """A signed URL of a sandbox port: a ``str`` (the URL) with ``expires_at``.

    Anyone with the URL reaches the port without an API key until
    ``expires_at`` (a timezone-aware :class:`datetime`, or ``None`` if the
    server sent none), while the sandbox runs.
    """

    expires_at: Optional[datetime]

    def __new__(cls, url: str, expires_at: Optional[datetime] = None) -> "SignedURL":
        obj = super().__new__(cls, url)
        obj.expires_at = expires_at
        return obj

    def __repr__(self) -> str:
        return "SignedURL(%s, expires_at=%r)" % (str.__repr__(self), self.expires_at)


@dataclass(frozen=True)
class Template:
    """A template (a root filesystem) and the state of its baked snapshot.

    Attributes:
        name: Template name (``base``, ``tiny``...).
        state: ``ready``, ``stale``, ``not_baked`` or ``baking``.
        memory_mib: Memory of the baked shape, if any.
        vcpus: vCPUs of the baked shape, if any.
        stale_reason: Why a stale template is stale.
        baked_at: When it was baked.
        bake_ms: How long baking took.
        image: The image a template built from one was built from (the
            API's ``from_image``); ``None`` for built-in templates.
        digest: That image's digest.
        built_at: When this version was built.
        build_ms: How long its build took.
        size_bytes: Apparent size of this version's root filesystem.
        disk_bytes: Disk space it takes (allocated blocks).
        version: The version of a user template this entry is (each build
            makes one; ``"NAME:3"`` pins version 3 for
            ``Sandbox.create(template=...)``); ``None`` for built-in ones.
        latest_version: The version ``"NAME"`` means for this key: the
            latest (for its owner and admin keys) or the latest published
            (for other keys).
        versions: Every version of a user template this key may use,
            oldest first (:class:`TemplateVersion`).
        public: Whether some version of the user template is published
            (usable by every key; an admin key publishes versions);
            ``None`` for built-in ones.
        owner: Id of the key that built it (listed for admin keys only).
        start_cmd: A user template's start command, run in the background
            before its snapshot (listed for admin keys only).
        ready_cmd: Its ready command (listed for admin keys only).
        ready_timeout_seconds: Its ready timeout in seconds, if not the
            default (listed for admin keys only).
        raw: The JSON object as received.

    ``Template.from_image(ref)`` starts the description of a new template
    to build from a container image (a :class:`TemplateBuilder`).
    """

    name: str
    state: str
    memory_mib: Optional[int] = None
    vcpus: Optional[int] = None
    stale_reason: Optional[str] = None
    baked_at: Optional[datetime] = None
    bake_ms: Optional[int] = None
    image: Optional[str] = None
    digest: Optional[str] = None
    built_at: Optional[datetime] = None
    build_ms: Optional[int] = None
    size_bytes: Optional[int] = None
    disk_bytes: Optional[int] = None
    version: Optional[int] = None
    latest_version: Optional[int] = None
    versions: List["TemplateVersion"] = field(default_factory=list)
    public: Optional[bool] = None
    owner: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    start_cmd: Optional[str] = None
    ready_cmd: Optional[str] = None
    ready_timeout_seconds: Optional[int] = None

    @property
    def ref(self) -> str:
        """``"NAME:VERSION"`` for a user template's entry (``NAME`` for a built-in one): what pins it."""
        return "%s:%d" % (self.name, self.version) if self.version else self.name

    @staticmethod
    def from_image(ref: str) -> "TemplateBuilder":
        """A template to build from container image ``ref`` (``registry.example.com/app:1.0``).

        Returns a :class:`TemplateBuilder`; nothing is sent before its
        ``build(name)``. Example::

            Template.from_image("registry.example.com/app:1.0").build("app", on_log=print)
        """
        from .templates import TemplateBuilder

        return TemplateBuilder(ref)

    @staticmethod
    def from_dockerfile(path_or_text: Any, context: Optional[str] = None) -> "TemplateBuilder":
        """A template to build from a Dockerfile: its path, or its text.

        A path (an ``os.PathLike``, or a one-line string naming an existing
        file) is read now, and its directory is the default build context;
        text (a string with a newline, or starting with ``FROM``, ``ARG`` or
        ``#``) has no context unless ``context`` names a directory. The
        context is sent as a gzip-compressed tar streamed from disk, its
        ``.dockerignore`` applied with Docker's rules. Chain
        ``.build_arg(k, v)``, ``.start_cmd(...)``, then ``.build(name)``::

            Template.from_dockerfile("./app/Dockerfile").build_arg("VERSION", "1.2").build("app", on_log=print)
            Template.from_dockerfile("FROM alpine:3.20\\nRUN apk add curl\\n").build("curl")
        """
        from .templates import dockerfile_builder

        return dockerfile_builder(path_or_text, context)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Template":
        """Build from the API's ``Template`` JSON object."""
        return cls(
            name=_str(d.get("name")),
            state=_str(d.get("state")),
            memory_mib=_opt_int(d.get("memory_mib")),
            vcpus=_opt_int(d.get("vcpus")),
            stale_reason=_opt_str(d.get("stale_reason")),
            baked_at=parse_time(d.get("baked_at")),
            bake_ms=_opt_int(d.get("bake_ms")),
            image=_opt_str(d.get("from_image")),
            digest=_opt_str(d.get("digest")),
            built_at=parse_time(d.get("built_at")),
            build_ms=_opt_int(d.get("build_ms")),
            size_bytes=_opt_int(d.get("size_bytes")),
            disk_bytes=_opt_int(d.get("disk_bytes")),
            version=_opt_int(d.get("version")),
            latest_version=_opt_int(d.get("latest_version")),
            versions=[TemplateVersion.from_dict(v) for v in d.get("versions") or []],
            public=d.get("public") if isinstance(d.get("public"), bool) else None,
            owner=_opt_str(d.get("owner")),
            raw=dict(d),
            start_cmd=_opt_str(d.get("start_cmd")),
            ready_cmd=_opt_str(d.get("ready_cmd")),
            ready_timeout_seconds=_opt_int(d.get("ready_timeout_seconds")),
        )


@dataclass(frozen=True)
class TemplateVersion:
    """One version of a user template (an entry of :attr:`Template.versions`).

    Attributes:
        version: Its number (from 1).
        published: Whether every key may use this version.
        built_at: When it was built.
        build_ms: How long its build took.
        size_bytes: Apparent size of its root filesystem.
        disk_bytes: Disk space it takes.
        image: The image it was built from (``from_image``).
        digest: That image's digest.
    """

    version: int
    built_at: Optional[datetime] = None
    build_ms: Optional[int] = None
    size_bytes: Optional[int] = None
    disk_bytes: Optional[int] = None
    image: Optional[str] = None
    digest: Optional[str] = None
    published: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TemplateVersion":
        """Build from an entry of the API's ``versions``."""
        return cls(
            version=_opt_int(d.get("version")) or 0,
            built_at=parse_time(d.get("built_at")),
            build_ms=_opt_int(d.get("build_ms")),
            size_bytes=_opt_int(d.get("size_bytes")),
            disk_bytes=_opt_int(d.get("disk_bytes")),
            image=_opt_str(d.get("from_image")),
            digest=_opt_str(d.get("digest")),
            published=d.get("published") is True,
        )


@dataclass(frozen=True)
class APIKey:
    """An API key (admin endpoints).

    Attributes:
        id: Key id (use it to revoke the key).
        name: Name given at creation.
        admin: Admin keys may manage keys and bake templates.
        created_at: When it was created.
        prefix: First characters of the secret, to recognise it.
        max_sandboxes: Concurrent sandboxes allowed (0: server default).
        max_memory_mib: Total guest memory allowed (0: server default).
        max_vcpus: Total vCPUs allowed (0: server default).
        max_disk_mib: Disk allowed in MiB: sandbox disks, paused sandboxes and
            snapshots (0: server default).
        key: The secret; only set on the object returned by
            :meth:`Client.create_key`, never shown again.
        revoked: The key was revoked (:meth:`Client.list_keys` lists revoked
            keys too); its requests answer 401.
        raw: The JSON object as received.
    """

    id: str
    name: str
    admin: bool
    created_at: Optional[datetime]
    prefix: Optional[str] = None
    max_sandboxes: Optional[int] = None
    max_memory_mib: Optional[int] = None
    max_vcpus: Optional[int] = None
    max_disk_mib: Optional[int] = None
    key: Optional[str] = field(default=None, repr=False)
    revoked: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "APIKey":
        """Build from the API's ``APIKey`` JSON object."""
        return cls(
            id=_str(d.get("id")),
            name=_str(d.get("name")),
            admin=bool(d.get("admin", False)),
            created_at=parse_time(d.get("created_at")),
            prefix=_opt_str(d.get("prefix")),
            max_sandboxes=_opt_int(d.get("max_sandboxes")),
            max_memory_mib=_opt_int(d.get("max_memory_mib")),
            max_vcpus=_opt_int(d.get("max_vcpus")),
            max_disk_mib=_opt_int(d.get("max_disk_mib")),
            key=_opt_str(d.get("key")),
            revoked=bool(d.get("revoked", False)),
            raw=dict(d),
        )
