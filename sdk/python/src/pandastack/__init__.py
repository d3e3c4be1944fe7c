"""PandaStack Python SDK: microVM sandboxes for AI agents.

Configuration comes from ``PANDASTACK_API_KEY`` and ``PANDASTACK_API_URL``
(default ``http://127.0.0.1:7788``); ``api_key=``/``api_url=`` arguments or
an explicit :class:`Client` override them.

Example::

    from pandastack import Sandbox, Volume

    with Sandbox.create(template="base", ttl_seconds=3600) as sb:
        r = sb.exec("echo hi")
        print(r.exit_code, r.stdout)
        sb.filesystem.write("/work/goal.md", "make the failing test pass")
        child = sb.fork()

    vol = Volume.create("data")  # persistent files, mounted by sandboxes
    with Sandbox.create(template="base", volumes={"/mnt/data": vol}) as sb:
        sb.exec("ls /mnt/data")

    with Sandbox.create(template="code-interpreter") as sb:
        sb.run_code("x = 41")
        print(sb.run_code("x + 1").text)  # 42

The asyncio flavour has the same surface with coroutines::

    from pandastack import AsyncSandbox

    async with AsyncSandbox.create(template="base") as sb:
        r = await sb.exec("echo hi")

Standard library only; Python 3.9 or newer.
"""

from .async_client import AsyncBuildLogs, AsyncClient, AsyncStreamResponse
from .async_processes import AsyncCommandHandle, AsyncCommands, AsyncOutputStream, AsyncPty, AsyncTerminalHandle
from .async_sandbox import AsyncDirWatch, AsyncExecStream, AsyncFilesystem, AsyncSandbox
from .code_interpreter import CodeContext, Execution, ExecutionError, Logs, Result
from .client import DEFAULT_API_URL, ENV_API_KEY, ENV_API_URL, Client, __version__
from .errors import (
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ConflictError,
    CorruptError,
    ForbiddenError,
    ForkError,
    InsufficientStorageError,
    InvalidArgumentError,
    NotFoundError,
    PandaConnectionError,
    PandaError,
    PayloadTooLargeError,
    QuotaExceededError,
    RequestTimeoutError,
    TooManyRequestsError,
    UnavailableError,
)
from .events import EVENTS_IDLE_TIMEOUT, AsyncEventStream, CommandRecord, Event, EventStream
from .filesystem import DirWatch, Filesystem, WatchEvent
from .models import APIKey, ExecResult, FileInfo, LazyMemory, MemoryUsage, NetworkPolicy, Port, SandboxInfo, SignedURL, Template, TemplateVersion, VolumeMount
from .sandbox import Sandbox
from .processes import CommandHandle, Commands, OutputChunk, OutputStream, ProcessInfo, Pty, TerminalHandle
from .snapshot import AsyncSnapshot, Snapshot
from .volume import Volume, VolumeFiles
from .async_volume import AsyncVolume, AsyncVolumeFiles
from ._buildcontext import ContextStats
from .templates import TemplateBuild, TemplateBuilder, TemplateBuildError

#: ``pandastack.ConnectionError`` is :class:`PandaConnectionError` (also a
#: subclass of the built-in ``ConnectionError``). It is left out of
#: ``__all__`` so that ``from pandastack import *`` does not shadow the built-in.
ConnectionError = PandaConnectionError

__all__ = [
    "__version__",
    "Client",
    "Sandbox",
    "Snapshot",
    "Volume",
    "VolumeFiles",
    "VolumeMount",
    "Filesystem",
    "Commands",
    "CommandHandle",
    "TerminalHandle",
    "Pty",
    "ProcessInfo",
    "OutputChunk",
    "OutputStream",
    "WatchEvent",
    "DirWatch",
    "Event",
    "EventStream",
    "AsyncEventStream",
    "CommandRecord",
    "EVENTS_IDLE_TIMEOUT",
    "AsyncClient",
    "AsyncSandbox",
    "AsyncSnapshot",
    "AsyncVolume",
    "AsyncVolumeFiles",
    "AsyncFilesystem",
    "AsyncDirWatch",
    "AsyncExecStream",
    "AsyncCommands",
    "AsyncCommandHandle",
    "AsyncTerminalHandle",
    "AsyncPty",
    "AsyncOutputStream",
    "AsyncBuildLogs",
    "AsyncStreamResponse",
    "SandboxInfo",
    "LazyMemory",
    "MemoryUsage",
    "NetworkPolicy",
    "ExecResult",
    "Execution",
    "ExecutionError",
    "Result",
    "Logs",
    "CodeContext",
    "FileInfo",
    "Template",
    "TemplateBuilder",
    "TemplateVersion",
    "TemplateBuild",
    "ContextStats",
    "APIKey",
    "Port",
    "SignedURL",
    "DEFAULT_API_URL",
    "ENV_API_KEY",
    "ENV_API_URL",
    "PandaError",
    "ConfigurationError",
    "PandaConnectionError",
    "RequestTimeoutError",
    "BadRequestError",
    "AuthenticationError",
    "ForbiddenError",
    "NotFoundError",
    "ConflictError",
    "CorruptError",
    "PayloadTooLargeError",
    "InvalidArgumentError",
    "QuotaExceededError",
    "TooManyRequestsError",
    "InsufficientStorageError",
    "UnavailableError",
    "ForkError",
    "TemplateBuildError",
]
