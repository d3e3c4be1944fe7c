"""Templates built from container images or Dockerfiles: the builder and the build's status.

``Template.from_image(ref)`` or ``Template.from_dockerfile(path_or_text,
context=dir)`` (or :class:`TemplateBuilder` directly) describes a template
to build; ``.build(name)`` asks the server to build it and follows the build
to its end. For an image the server pulls it from its registry and makes its
layers the template's root filesystem; for a Dockerfile the SDK sends the
Dockerfile and the context directory (a gzip-compressed tar streamed from
disk, ``.dockerignore`` applied with Docker's rules) as
``multipart/form-data`` (``POST /v1/templates``, any key, ``panda up`` only
so far). Each build makes a new version of the template, private to the
building key until an admin key publishes it. The build itself runs on the
server; the SDK only sends the request and reads the build's log stream.

Steps added with ``run``, ``copy``, ``env``, ``workdir`` and ``user`` make
the build a Dockerfile build: they become the Dockerfile's ``RUN``,
``COPY``, ``ENV``, ``WORKDIR`` and ``USER`` lines after its ``FROM`` (the
image) or after the Dockerfile given, and the files ``copy`` names are sent
in its build context.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Mapping, Optional, Tuple, Union

from ._buildcontext import ContextStats, tar_gz_stream
from .errors import PandaError
from .models import _opt_int, _opt_str, _str, parse_time

if TYPE_CHECKING:  # pragma: no cover
    from .async_client import AsyncClient
    from .client import Client

__all__ = [
    "TemplateBuilder",
    "TemplateBuild",
    "TemplateBuildError",
    "BUILD_QUEUED",
    "BUILD_RUNNING",
    "BUILD_SUCCEEDED",
    "BUILD_FAILED",
    "CODE_IMAGE_NOT_FOUND",
    "CODE_BUILD_FAILED",
    "CODE_CANCELED",
]

#: Build states (:attr:`TemplateBuild.status`).
BUILD_QUEUED = "queued"
BUILD_RUNNING = "running"
BUILD_SUCCEEDED = "succeeded"
BUILD_FAILED = "failed"

#: Why a failed build failed (:attr:`TemplateBuild.code`, :attr:`TemplateBuildError.code`).
CODE_IMAGE_NOT_FOUND = "image_not_found"
CODE_BUILD_FAILED = "build_failed"
CODE_CANCELED = "canceled"


@dataclass(frozen=True)
class TemplateBuild:
    """A build of a template from a container image (``GET /v1/templates/builds/{id}``).

    Attributes:
        build_id: The build's id (for :meth:`Client.get_template_build` and
            :meth:`Client.template_build_logs`).
        name: The template being built.
        from_image: The image reference, as given.
        status: ``queued``, ``running``, ``succeeded`` or ``failed``.
        code: Why a failed build failed: ``image_not_found``,
            ``build_failed``, ``canceled`` or ``interrupted`` (the server
            restarted during it).
        error: What went wrong, for users, when it failed.
        digest: The image's digest, once it succeeded.
        version: The template version it made, once it succeeded.
        created_at, started_at, ended_at: When it was asked for, started, ended.
        host_id: On a fleet, the host that runs the build (``None`` elsewhere).
        raw: The JSON object as received.
    """

    build_id: str
    name: str
    status: str
    from_image: str = ""
    code: Optional[str] = None
    error: Optional[str] = None
    digest: Optional[str] = None
    version: Optional[int] = None
    created_at: Optional[datetime] = None
    started_at: Optional[datetime] = None
    ended_at: Optional[datetime] = None
    host_id: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TemplateBuild":
        """Build from the API's ``TemplateBuild`` JSON object."""
        return cls(
            build_id=_str(d.get("build_id")),
            name=_str(d.get("name")),
            status=_str(d.get("status")),
            from_image=_str(d.get("from_image")),
            code=_opt_str(d.get("code")),
            error=_opt_str(d.get("error")),
            digest=_opt_str(d.get("digest")),
            version=_opt_int(d.get("version")),
            created_at=parse_time(d.get("created_at")),
            started_at=parse_time(d.get("started_at")),
            ended_at=parse_time(d.get("ended_at")),
            host_id=_opt_str(d.get("host_id")),
            raw=dict(d),
        )

    @property
    def done(self) -> bool:
        """Whether the build has ended (succeeded or failed)."""
        return self.status in (BUILD_SUCCEEDED, BUILD_FAILED)

    @property
    def succeeded(self) -> bool:
        """Whether the build ended with the template built."""
        return self.status == BUILD_SUCCEEDED


class TemplateBuildError(PandaError):
    """A template build ended without a template (its status is ``failed``).

    ``code`` is the build's (``image_not_found``, ``build_failed``,
    ``canceled``), ``message`` the server's ``error``; ``status`` is ``None``
    (the request itself succeeded: the build failed afterwards).

    Attributes:
        build: The failed build, as the server reported it at its end.
    """

    def __init__(self, message: str, *, build: TemplateBuild, code: Optional[str] = None) -> None:
        super().__init__(message, status=None, code=code)
        self.build: TemplateBuild = build

    @classmethod
    def from_build(cls, build: TemplateBuild) -> "TemplateBuildError":
        msg = build.error or "the build of template %r from %s failed" % (build.name, build.from_image or "its image")
        return cls(msg, build=build, code=build.code or CODE_BUILD_FAILED)


@dataclass(frozen=True)
class TemplateBuilder:
    """What a template is built from: a container image or a Dockerfile (with
    its build context and build arguments), and optionally a command that
    starts with each sandbox.

    Made with ``Template.from_image(ref)`` or ``Template.from_dockerfile(...)``;
    each method returns a new builder (this one is not changed), so a
    builder may be shared and reused. Nothing is sent to the server before
    :meth:`build`.

    Example::

        from pandastack import Template

        result = (
            Template.from_image("registry.example.com/myapp:1.0")
            .start_cmd("python3 -m http.server 8000", ready="curl -sf localhost:8000")
            .build("myapp", on_log=print)
        )
        Template.from_dockerfile("./app/Dockerfile").build_arg("VERSION", "1.2").build("app")
        (
            Template.from_image("registry.example.com/python:3.12")
            .run("pip install flask")
            .copy("./app", "/srv/app")
            .env(FLASK_APP="app")
            .start_cmd("flask run --port 8000", ready="curl -sf localhost:8000")
            .build("flask")
        )
    """

    image: str = ""
    start_command: Optional[str] = None
    ready_command: Optional[str] = None
    ready_timeout_seconds: Optional[int] = None
    #: The Dockerfile's text (a Dockerfile build), and its context directory.
    dockerfile: Optional[str] = None
    context: Optional[str] = None
    build_args: Tuple[Tuple[str, str], ...] = ()
    #: Steps added with run, copy, env, workdir and user: Dockerfile lines,
    #: and for each copy its (local path, name in the context).
    steps: Tuple[str, ...] = ()
    copies: Tuple[Tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.dockerfile is not None:
            if self.image:
                raise ValueError("build from an image or from a Dockerfile, not both")
            if not isinstance(self.dockerfile, str) or not self.dockerfile.strip():
                raise ValueError("the Dockerfile is empty")
            if self.context is not None and not os.path.isdir(self.context):
                raise NotADirectoryError("build context %s is not a directory" % self.context)
            return
        if self.build_args:
            raise ValueError("build arguments are for Dockerfile builds (Template.from_dockerfile)")
        if not isinstance(self.image, str) or not self.image.strip():
            raise ValueError("an image reference is required, such as registry.example.com/app:1.0")

    def build_arg(self, key: str, value: str) -> "TemplateBuilder":
        """Set the Dockerfile's ARG ``key`` to ``value`` (Dockerfile builds only; the last value of a key wins)."""
        if self.dockerfile is None:
            raise ValueError("build arguments are for Dockerfile builds (Template.from_dockerfile)")
        if not isinstance(key, str) or not _ARG_NAME.match(key):
            raise ValueError("build_arg: %r is not an ARG name (letters, digits and _, not starting with a digit)" % (key,))
        if not isinstance(value, str):
            raise ValueError("build_arg %s: the value must be a string, got %s" % (key, type(value).__name__))
        args = tuple((k, v) for k, v in self.build_args if k != key) + ((key, value),)
        return dataclasses.replace(self, build_args=args)

    def start_cmd(self, cmd: str, *, ready: Optional[str] = None, ready_timeout_seconds: Optional[int] = None) -> "TemplateBuilder":
        """Start ``cmd`` (a shell command) in every sandbox of the template.

        ``ready`` is a shell command that succeeds once ``cmd`` is ready to
        use (e.g. ``curl -sf localhost:8000``); ``ready_timeout_seconds`` how
        long to wait for it. Sent as ``start_cmd``, ``ready_cmd`` and
        ``ready_timeout_seconds``; a server that does not know them answers
        400 (:class:`BadRequestError`).
        """
        if not isinstance(cmd, str) or not cmd.strip():
            raise ValueError("start_cmd needs a command")
        b = dataclasses.replace(self, start_command=cmd)
        if ready is None and ready_timeout_seconds is not None:
            if self.ready_command is None:
                raise ValueError("ready_timeout_seconds needs a ready command (ready=...)")
            ready = self.ready_command
        if ready is not None:
            b = b.ready_cmd(ready, timeout_seconds=ready_timeout_seconds)
        return b

    def ready_cmd(self, cmd: str, *, timeout_seconds: Optional[int] = None) -> "TemplateBuilder":
        """Set the command that tells that the start command is ready (see :meth:`start_cmd`)."""
        if not isinstance(cmd, str) or not cmd.strip():
            raise ValueError("ready_cmd needs a command")
        if timeout_seconds is not None and (isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int) or timeout_seconds <= 0):
            raise ValueError("ready_timeout_seconds must be a positive number of seconds, got %r" % (timeout_seconds,))
        return dataclasses.replace(self, ready_command=cmd, ready_timeout_seconds=timeout_seconds if timeout_seconds is not None else self.ready_timeout_seconds)

    def run(self, cmd: str) -> "TemplateBuilder":
        """Run ``cmd`` (a ``/bin/sh -c`` script) in the build, as the
        Dockerfile's ``RUN``: in a build VM booted from the steps before,
        with the network when the server's operator allows it
        (``--bake-network``). A command that fails fails the build."""
        if not isinstance(cmd, str) or not cmd.strip():
            raise ValueError("run needs a command")
        return self._step("RUN " + json.dumps(["/bin/sh", "-c", cmd]))

    def copy(self, src: Union[str, "os.PathLike[str]"], dst: str, *, user: Optional[str] = None) -> "TemplateBuilder":
        """Copy the local file or directory ``src`` to ``dst`` in the template,
        as the Dockerfile's ``COPY`` (a directory's contents go into
        ``dst``; ``user``, as ``name[:group]`` or ``uid[:gid]``, owns what is
        copied, root otherwise). With a Dockerfile's context directory,
        ``src`` must be inside it."""
        src = os.fspath(src)
        if not os.path.lexists(src):
            raise FileNotFoundError("copy: %s: no such file or directory" % src)
        if not isinstance(dst, str) or not dst.strip():
            raise ValueError("copy needs a destination path")
        _no_newline("copy", dst)
        flag = ""
        if user is not None:
            if not isinstance(user, str) or not re.match(r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$", user):
                raise ValueError("copy: user %r must be name[:group] or uid[:gid]" % (user,))
            flag = "--chown=%s " % user
        if self.context is not None:
            rel = os.path.relpath(os.path.abspath(src), os.path.abspath(self.context))
            if rel == os.pardir or rel.startswith(os.pardir + os.sep):
                raise ValueError("copy: %s is outside the build context %s" % (src, self.context))
            return self._step("COPY " + flag + json.dumps([rel.replace(os.sep, "/"), dst]))
        name = "copy-%d/%s" % (len(self.copies), os.path.basename(os.path.normpath(src)) or "root")
        b = self._step("COPY " + flag + json.dumps([name, dst]))
        return dataclasses.replace(b, copies=b.copies + ((src, name),))

    def env(self, *args: Mapping[str, str], **kwargs: str) -> "TemplateBuilder":
        """Set environment variables for the steps after this one and for the
        template's commands, as the Dockerfile's ``ENV``:
        ``.env(NAME="value")`` or ``.env({"NAME": "value"})``."""
        pairs: Dict[str, str] = {}
        for a in args:
            if not isinstance(a, Mapping):
                raise TypeError("env takes a mapping or keyword arguments, got %s" % type(a).__name__)
            pairs.update(a)
        pairs.update(kwargs)
        if not pairs:
            raise ValueError("env needs at least one variable")
        parts = []
        for k, v in pairs.items():
            if not isinstance(k, str) or not _ARG_NAME.match(k):
                raise ValueError("env: %r is not a variable name" % (k,))
            if not isinstance(v, str):
                raise ValueError("env %s: the value must be a string, got %s" % (k, type(v).__name__))
            _no_newline("env " + k, v)
            parts.append('%s="%s"' % (k, re.sub(r'(["\\$])', r"\\\1", v)))
        return self._step("ENV " + " ".join(parts))

    def workdir(self, path: str) -> "TemplateBuilder":
        """Set the working directory of the steps after this one and of the
        template's commands (created if missing), as the Dockerfile's ``WORKDIR``."""
        if not isinstance(path, str) or not path.strip():
            raise ValueError("workdir needs a path")
        _no_newline("workdir", path)
        return self._step("WORKDIR " + path)

    def user(self, name: str) -> "TemplateBuilder":
        """Run the steps after this one, and the template's commands, as
        ``name`` (``name[:group]`` or ``uid[:gid]``), as the Dockerfile's ``USER``."""
        if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$", name):
            raise ValueError("user %r must be name[:group] or uid[:gid]" % (name,))
        return self._step("USER " + name)

    def _step(self, line: str) -> "TemplateBuilder":
        return dataclasses.replace(self, steps=self.steps + (line,))

    def effective_dockerfile(self) -> Optional[str]:
        """The Dockerfile this builds (None for an image build with no steps):
        the Dockerfile given, or ``FROM`` the image, then the steps."""
        if self.dockerfile is None and not self.steps:
            return None
        text = self.dockerfile if self.dockerfile is not None else "FROM %s\n" % self.image
        if self.steps:
            text = text.rstrip("\n") + "\n" + "\n".join(self.steps) + "\n"
        return text

    def request_body(self, name: str) -> Dict[str, Any]:
        """The JSON object of ``POST /v1/templates`` that builds this as template
        ``name``: the whole body, or with a context the ``spec`` part."""
        body: Dict[str, Any] = {"name": name}
        dockerfile = self.effective_dockerfile()
        if dockerfile is None:
            body["from_image"] = self.image
        else:
            if self.context is None and not self.copies:
                body["dockerfile"] = dockerfile
            if self.build_args:
                body["build_args"] = dict(self.build_args)
        if self.start_command is not None:
            body["start_cmd"] = self.start_command
        if self.ready_command is not None:
            body["ready_cmd"] = self.ready_command
        if self.ready_timeout_seconds is not None:
            body["ready_timeout_seconds"] = self.ready_timeout_seconds
        return body

    def build(
        self,
        name: str,
        *,
        on_log: Optional[Callable[[str], None]] = None,
        on_context: Optional[Callable[[ContextStats], None]] = None,
        client: "Optional[Client]" = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> TemplateBuild:
        """Build this as template ``name`` and wait for the build to end.

        ``on_log`` is called with each line of the build's log as it
        arrives; ``on_context`` (Dockerfile builds with a context) after
        each file of the context sent, with the counts so far. Building
        again under a name makes a new version (the build's ``version``);
        sandboxes created with ``template=name`` then start from it, while
        ``template="name:1"`` pins version 1 and sandboxes made earlier
        keep theirs.

        Returns the succeeded build. Raises :class:`TemplateBuildError`
        (with the build's ``code`` and ``error``) if it failed, and the
        usual :class:`PandaError` subclasses if the request is refused
        (:class:`InvalidArgumentError` for a bad name or reference,
        :class:`ConflictError` for a name another key owns,
        :class:`QuotaExceededError` (code ``template_limit``) for a key
        that owns its limit of templates).
        """
        from .client import resolve_client

        c = resolve_client(client, api_key, api_url)
        dockerfile = self.effective_dockerfile()
        if dockerfile is not None:
            context, tmp = self.context, None
            if self.copies:
                tmp = context = _copies_context(self.copies)
            try:
                b = c.start_dockerfile_build(
                    name,
                    dockerfile,
                    context=context,
                    build_args=dict(self.build_args) or None,
                    start_cmd=self.start_command,
                    ready_cmd=self.ready_command,
                    ready_timeout_seconds=self.ready_timeout_seconds,
                    on_context=on_context,
                )
            finally:
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
            b = c.follow_template_build(b.build_id, on_log=on_log)
            if not b.succeeded:
                raise TemplateBuildError.from_build(b)
            return b
        return c.build_template(
            name,
            self.image,
            start_cmd=self.start_command,
            ready_cmd=self.ready_command,
            ready_timeout_seconds=self.ready_timeout_seconds,
            on_log=on_log,
        )


    async def build_async(
        self,
        name: str,
        *,
        on_log: Optional[Callable[[str], Any]] = None,
        on_context: Optional[Callable[[ContextStats], None]] = None,
        client: "Optional[AsyncClient]" = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> TemplateBuild:
        """:meth:`build` for asyncio: ``await Template.from_image(ref).build_async("app")``.

        The same arguments, result and errors, through an
        :class:`~pandastack.AsyncClient`; ``on_log`` may be a plain or an
        async function. Copying ``copy()`` sources into a temporary context
        and archiving the context run in the loop's default executor.
        """
        import asyncio

        from .async_client import resolve_async_client

        c = resolve_async_client(client, api_key, api_url)
        dockerfile = self.effective_dockerfile()
        if dockerfile is not None:
            context, tmp = self.context, None
            if self.copies:
                tmp = context = await asyncio.get_running_loop().run_in_executor(None, _copies_context, self.copies)
            try:
                b = await c.start_dockerfile_build(
                    name,
                    dockerfile,
                    context=context,
                    build_args=dict(self.build_args) or None,
                    start_cmd=self.start_command,
                    ready_cmd=self.ready_command,
                    ready_timeout_seconds=self.ready_timeout_seconds,
                    on_context=on_context,
                )
            finally:
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
            b = await c.follow_template_build(b.build_id, on_log=on_log)
            if not b.succeeded:
                raise TemplateBuildError.from_build(b)
            return b
        return await c.build_template(
            name,
            self.image,
            start_cmd=self.start_command,
            ready_cmd=self.ready_command,
            ready_timeout_seconds=self.ready_timeout_seconds,
            on_log=on_log,
        )

_ARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _no_newline(what: str, v: str) -> None:
    if "\n" in v or "\r" in v or "\0" in v:
        raise ValueError("%s: %r must not contain a newline or NUL" % (what, v))


def _copies_context(copies: Tuple[Tuple[str, str], ...]) -> str:
    """A temporary build context holding each copy's source under its name
    (symbolic links copied as links); the caller removes it."""
    root = tempfile.mkdtemp(prefix="pandastack-context-")
    try:
        for src, name in copies:
            dst = os.path.join(root, *name.split("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.isdir(src) and not os.path.islink(src):
                shutil.copytree(src, dst, symlinks=True)
            else:
                shutil.copy2(src, dst, follow_symlinks=False)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root
_INSTRUCTION = re.compile(r"^\s*(#|(FROM|ARG)\s)", re.IGNORECASE)
#: The server's bound on a Dockerfile's text.
MAX_DOCKERFILE_BYTES = 1 << 20


def dockerfile_builder(path_or_text: Union[str, "os.PathLike[str]"], context: Optional[str] = None) -> TemplateBuilder:
    """The builder of ``Template.from_dockerfile``.

    ``path_or_text`` is a path (an ``os.PathLike``, or a one-line string
    naming an existing file) or the Dockerfile's text (a string with a
    newline, or starting with ``FROM``, ``ARG`` or ``#``). A path's
    directory is the default context; text has no context unless given.
    """
    text: Optional[str] = None
    path: Optional[str] = None
    if isinstance(path_or_text, os.PathLike):
        path = os.fspath(path_or_text)
    elif not isinstance(path_or_text, str):
        raise TypeError("from_dockerfile takes a path or the Dockerfile's text, got %s" % type(path_or_text).__name__)
    elif "\n" in path_or_text or os.path.isfile(path_or_text) is False and _INSTRUCTION.match(path_or_text):
        text = path_or_text
    else:
        path = path_or_text
    if path is not None:
        if os.path.isdir(path):
            raise IsADirectoryError("Dockerfile %s is a directory; name the file (%s)" % (path, os.path.join(path, "Dockerfile")))
        if not os.path.isfile(path):
            raise FileNotFoundError("Dockerfile %s: no such file" % path)
        if os.path.getsize(path) > MAX_DOCKERFILE_BYTES:
            raise ValueError("Dockerfile %s is larger than %d bytes" % (path, MAX_DOCKERFILE_BYTES))
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if context is None:
            context = os.path.dirname(path) or "."
    assert text is not None
    if len(text.encode("utf-8")) > MAX_DOCKERFILE_BYTES:
        raise ValueError("the Dockerfile is larger than %d bytes" % MAX_DOCKERFILE_BYTES)
    return TemplateBuilder(dockerfile=text, context=context)


class _Chunks:
    """A file-like object over an iterator of bytes (a streamed request body)."""

    def __init__(self, it: Iterator[bytes]) -> None:
        self._it = it

    def read(self, size: int = -1) -> bytes:
        for chunk in self._it:
            if chunk:
                return chunk
        return b""


def multipart_build_body(
    spec: Mapping[str, Any],
    dockerfile: Optional[str],
    context: str,
    on_context: Optional[Callable[[ContextStats], None]] = None,
) -> Tuple[_Chunks, str]:
    """The ``multipart/form-data`` body of a Dockerfile build with a context,
    streamed: the ``spec`` part, the ``dockerfile`` part (if given), the
    ``context`` part (a gzip-compressed tar of directory ``context``).
    Returns a file-like body and its Content-Type."""
    boundary = "pandastack-" + uuid.uuid4().hex

    def head(name: str, content_type: str, filename: Optional[str] = None) -> bytes:
        disp = 'form-data; name="%s"' % name
        if filename:
            disp += '; filename="%s"' % filename
        return ("--%s\r\nContent-Disposition: %s\r\nContent-Type: %s\r\n\r\n" % (boundary, disp, content_type)).encode()

    def parts() -> Iterator[bytes]:
        yield head("spec", "application/json") + json.dumps(dict(spec), separators=(",", ":")).encode("utf-8") + b"\r\n"
        if dockerfile is not None:
            yield head("dockerfile", "text/plain; charset=utf-8", "Dockerfile") + dockerfile.encode("utf-8") + b"\r\n"
        yield head("context", "application/gzip", "context.tar.gz")
        yield from tar_gz_stream(context, on_context)
        yield ("\r\n--%s--\r\n" % boundary).encode()

    return _Chunks(parts()), "multipart/form-data; boundary=" + boundary
