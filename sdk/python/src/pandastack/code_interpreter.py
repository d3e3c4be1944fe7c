"""The code interpreter's data and wire (``sb.run_code`` and the code contexts).

A sandbox made from the ``code-interpreter`` template runs a code server
with live interpreters, *contexts* (Python on IPython, JavaScript on Node.js,
bash), whose variables persist from one cell to the next.
``POST /v1/sandboxes/{id}/code`` runs a cell and streams its output as NDJSON
events (``stdout``, ``stderr``, ``result``, ``error``, then ``end``), which
this module decodes into an :class:`Execution`.

Pure: no I/O. :class:`~pandastack.Sandbox` and
:class:`~pandastack.AsyncSandbox` send the requests built here and feed each
event of the answer to one :class:`CodeRun`, so both flavours build the same
bodies and the same results.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from . import errors as _errors
from ._command import check_str_map
from .errors import PandaConnectionError, PandaError

__all__ = ["Execution", "Result", "ExecutionError", "Logs", "CodeContext", "ResultCallback", "ContextArg"]

#: The server's default cell timeout (``timeout=None``), and the most a cell may ask for.
DEFAULT_CODE_TIMEOUT = 300
MAX_CODE_TIMEOUT = 3600

# Extra seconds a client waits for a cell's stream beyond the cell's own timeout.
_CODE_MARGIN = 30.0

# MIME type of a result's bundle -> the Result attribute that holds it. The
# binary types arrive base64-encoded and are decoded to bytes.
_MIME_FIELDS: Tuple[Tuple[str, str], ...] = (
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
    ("application/vnd.pandastack.data+json", "data"),
)
_BINARY = frozenset(["image/png", "image/jpeg", "application/pdf"])
_ANY_JSON = frozenset(["application/json", "application/vnd.pandastack.data+json"])
_KNOWN_MIME = frozenset(m for m, _ in _MIME_FIELDS)

# IPython's display hooks and the attribute each returns.
_REPR_HOOKS = ("html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript")


def _malformed(what: str, ev: Any) -> PandaError:
    text = repr(ev)
    if len(text) > 200:
        text = text[:200] + "..."
    return PandaError("malformed %s in the code stream from the server: %s" % (what, text))


def _opt_str_field(ev: Mapping[str, Any], key: str, what: str) -> Optional[str]:
    v = ev.get(key)
    if v is None or isinstance(v, str):
        return v
    raise _malformed("%s (%s is no string)" % (what, key), ev)


def _decode_binary(mime: str, v: str) -> bytes:
    try:
        return base64.b64decode("".join(v.split()), validate=True)
    except (binascii.Error, ValueError):
        raise PandaError("malformed result in the code stream from the server: its %s is not base64" % mime) from None


@dataclass(frozen=True)
class Result:
    """One thing a cell displayed: the value of its last expression (the *main
    result*, ``is_main_result``) or a ``display(...)`` call, such as a
    matplotlib figure. It holds the same data in one or more formats.

    In a Jupyter notebook a :class:`Result` displays itself (the ``_repr_*_``
    hooks of IPython): ``results[0]`` as the last line of a notebook cell shows
    the chart, the table or the text.

    Attributes:
        text: ``text/plain``, as ``repr`` shows it (``"2"``, ``"<Figure ...>"``).
        html: ``text/html`` (a pandas DataFrame's table).
        markdown: ``text/markdown``.
        svg: ``image/svg+xml``.
        png: ``image/png``, the image's bytes (decoded from the wire's base64).
        jpeg: ``image/jpeg``, the image's bytes.
        pdf: ``application/pdf``, the document's bytes.
        latex: ``text/latex``.
        json: ``application/json``: any JSON value, decoded.
        javascript: ``application/javascript``.
        data: A pandas DataFrame's data as ``DataFrame.to_dict(orient="list")``
            (``application/vnd.pandastack.data+json``), as E2B's ``data``.
        chart: A matplotlib figure described as E2B's chart object (a ``dict``
            with ``type``, ``title``, ``elements``...), or ``None``.
        extra: The formats of any other MIME type, ``{mime: value}``.
        is_main_result: The value of the cell's last expression (not a ``display`` call).
        mime: The whole MIME bundle as the server sent it, ``{mime: value}``
            (binary formats still base64 text): what a notebook displays.
        raw: The ``result`` event as received.
    """

    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[bytes] = field(default=None, repr=False)
    jpeg: Optional[bytes] = field(default=None, repr=False)
    pdf: Optional[bytes] = field(default=None, repr=False)
    latex: Optional[str] = None
    json: Any = None
    javascript: Optional[str] = None
    data: Any = None
    chart: Optional[Dict[str, Any]] = None
    extra: Dict[str, Any] = field(default_factory=dict)
    is_main_result: bool = False
    mime: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Result":
        """Build from a ``result`` event: ``{"is_main_result", "data": {mime: value}, "chart"?}``.

        Raises :class:`PandaError` when a known format has the wrong type (a
        text format that is no string, an image that is not base64).
        """
        bundle = d.get("data")
        if bundle is None:
            bundle = {}
        if not isinstance(bundle, Mapping):
            raise _malformed("result (data is no object)", d)
        kw: Dict[str, Any] = {}
        extra: Dict[str, Any] = {}
        for mime, v in bundle.items():
            if mime not in _KNOWN_MIME:
                extra[str(mime)] = v
        for mime, name in _MIME_FIELDS:
            v = bundle.get(mime)
            if v is None:
                continue
            if mime in _ANY_JSON:
                kw[name] = v
                continue
            if not isinstance(v, str):
                raise _malformed("result (its %s is no string)" % mime, d)
            kw[name] = _decode_binary(mime, v) if mime in _BINARY else v
        chart = d.get("chart")
        if chart is not None and not isinstance(chart, Mapping):
            raise _malformed("result (chart is no object)", d)
        main = d.get("is_main_result", False)
        if not isinstance(main, bool):
            raise _malformed("result (is_main_result is no boolean)", d)
        return cls(
            chart=dict(chart) if chart is not None else None,
            extra=extra,
            is_main_result=main,
            mime=dict(bundle),
            raw=dict(d),
            **kw,
        )

    def formats(self) -> List[str]:
        """The formats this result has: attribute names (``"text"``, ``"png"``...),
        then the MIME types of ``extra``. E2B's ``formats()``."""
        names = ["text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript", "data", "chart"]
        return [n for n in names if getattr(self, n) is not None] + list(self.extra)

    def __getitem__(self, key: str) -> Any:
        """``result["png"]`` is ``result.png``; a MIME type (``result["image/png"]``) is the bundle's value for it."""
        if "/" in key:
            return self.mime[key]
        if key.startswith("_") or key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def __str__(self) -> str:
        return self.text if self.text is not None else repr(self)

    def __repr__(self) -> str:
        text = self.text
        if text is not None and len(text) > 60:
            text = text[:57] + "..."
        return "Result(formats=%r, is_main_result=%r%s)" % (self.formats(), self.is_main_result, "" if text is None else ", text=%r" % text)

    # -- IPython's display hooks ---------------------------------------------

    def _repr_mimebundle_(self, include: Optional[Iterable[str]] = None, exclude: Optional[Iterable[str]] = None) -> Dict[str, Any]:
        """The MIME bundle as sent (images base64-encoded, as Jupyter carries them)."""
        out = dict(self.mime)
        if include is not None:
            inc = set(include)
            out = {k: v for k, v in out.items() if k in inc}
        if exclude is not None:
            for k in exclude:
                out.pop(k, None)
        return out

    def _repr_html_(self) -> Optional[str]:
        return self.html

    def _repr_markdown_(self) -> Optional[str]:
        return self.markdown

    def _repr_svg_(self) -> Optional[str]:
        return self.svg

    def _repr_png_(self) -> Optional[bytes]:
        return self.png

    def _repr_jpeg_(self) -> Optional[bytes]:
        return self.jpeg

    def _repr_pdf_(self) -> Optional[bytes]:
        return self.pdf

    def _repr_latex_(self) -> Optional[str]:
        return self.latex

    def _repr_json_(self) -> Any:
        return self.json

    def _repr_javascript_(self) -> Optional[str]:
        return self.javascript


@dataclass(frozen=True)
class ExecutionError:
    """The error a cell ended with (it is in :attr:`Execution.error`, not raised).

    Attributes:
        name: The exception's class (``"ZeroDivisionError"``, ``"SyntaxError"``).
            Special names: ``"TimeoutError"`` (the cell ran past its timeout and
            was interrupted; the context lives on), ``"KeyboardInterrupt"``
            (interrupted by :meth:`~pandastack.Sandbox.interrupt_code`),
            ``"KernelDied"`` (the interpreter died, e.g. ``os._exit(1)``:
            restart the context), ``"ExitError"`` (bash: the cell's last command
            exited non-zero; ``value`` is ``"exit status N"``).
        value: The exception's message.
        traceback: The traceback, lines joined by ``"\\n"``, without colours.
    """

    name: str
    value: str = ""
    traceback: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ExecutionError":
        """Build from an ``error`` event ``{"name", "value", "traceback"}``."""
        name = _opt_str_field(d, "name", "error")
        return cls(
            name=name or "",
            value=_opt_str_field(d, "value", "error") or "",
            traceback=_opt_str_field(d, "traceback", "error") or "",
        )

    def __str__(self) -> str:
        return "%s: %s" % (self.name, self.value) if self.value else self.name


@dataclass(frozen=True)
class Logs:
    """What a cell printed, in pieces as they came.

    Attributes:
        stdout: The pieces of standard output (``"".join(logs.stdout)`` is all of it).
        stderr: The pieces of standard error.
    """

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class Execution:
    """The outcome of :meth:`~pandastack.Sandbox.run_code`.

    An exception or a syntax error in the cell is :attr:`error`, not raised.

    Attributes:
        results: What the cell displayed, in order (:class:`Result`); the
            value of its last expression has ``is_main_result``.
        logs: Its stdout and stderr (:class:`Logs`).
        error: The error it ended with, or ``None``.
        execution_count: The context's cell counter after this cell (``None``
            when the interpreter keeps none, or the cell never ran).
        truncated: The output went over the server's limit: the rest was
            dropped after a ``[output truncated ...]`` line on stderr.
        context_id: The context the cell ran in.
        duration_ms: How long the cell ran, in the guest.
    """

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    truncated: bool = False
    context_id: str = ""
    duration_ms: int = 0

    @property
    def text(self) -> Optional[str]:
        """The ``text/plain`` of the main result, or ``None`` when there is none."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass(frozen=True)
class CodeContext:
    """A live interpreter in a sandbox, with its own variables and working directory.

    Attributes:
        id: Its id (pass the :class:`CodeContext` or the id as ``context=``).
        language: ``"python"``, ``"javascript"`` or ``"bash"``.
        cwd: Its working directory.
        state: ``"idle"``, ``"busy"`` (running a cell) or ``"dead"`` (its
            interpreter died: :meth:`~pandastack.Sandbox.restart_code_context`).
        raw: The JSON object as received.
    """

    id: str
    language: str
    cwd: str
    state: str
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CodeContext":
        def s(k: str) -> str:
            v = d.get(k)
            return v if isinstance(v, str) else ""

        return cls(id=s("id"), language=s("language"), cwd=s("cwd"), state=s("state"), raw=dict(d))


#: A context as the code methods take it: a :class:`CodeContext` or its id.
ContextArg = Union[CodeContext, str]

#: Called with each :class:`Result` as it arrives.
ResultCallback = Callable[[Result], Any]


def context_id(context: Any) -> str:
    """The id of a :data:`ContextArg`; TypeError or ValueError for anything else."""
    if isinstance(context, CodeContext):
        context = context.id
    if not isinstance(context, str):
        raise TypeError("context must be a CodeContext or a context id (str), got %r" % (context,))
    if not context:
        raise ValueError("context id is empty")
    return context


def _timeout_seconds(timeout: Any) -> int:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout):
        raise TypeError("timeout must be a number of seconds, got %r" % (timeout,))
    if not 0 < timeout <= MAX_CODE_TIMEOUT:
        raise ValueError("timeout must be more than 0 and at most %d seconds, got %r" % (MAX_CODE_TIMEOUT, timeout))
    return int(math.ceil(timeout))


def code_body(code: Any, language: Optional[str], context: Optional[ContextArg], envs: Optional[Mapping[str, str]], timeout: Optional[float]) -> Dict[str, Any]:
    """The body of ``POST /v1/sandboxes/{id}/code``; TypeError or ValueError for bad arguments."""
    if not isinstance(code, str):
        raise TypeError("code must be a str, not %s" % type(code).__name__)
    if language is not None and context is not None:
        raise ValueError("pass language or context, not both: a context has its own language")
    body: Dict[str, Any] = {"code": code}
    if language is not None:
        if not isinstance(language, str) or not language:
            raise ValueError("language must be a non-empty str (python, javascript or bash), got %r" % (language,))
        body["language"] = language
    if context is not None:
        body["context_id"] = context_id(context)
    env = check_str_map("envs", envs)
    if env is not None:
        body["env"] = env
    if timeout is not None:
        body["timeout_seconds"] = _timeout_seconds(timeout)
    return body


def code_wait(client_timeout: Optional[float], body: Mapping[str, Any]) -> float:
    """Socket timeout for a cell's stream: its own timeout plus a margin.

    A cell waiting in its context's queue counts against its timeout too, so
    the server ends the stream within the cell's timeout.
    """
    if client_timeout is None:
        return float("inf")
    return max(client_timeout, float(body.get("timeout_seconds") or DEFAULT_CODE_TIMEOUT) + _CODE_MARGIN)


def context_body(language: Optional[str], cwd: Optional[str]) -> Dict[str, Any]:
    """The body of ``POST /v1/sandboxes/{id}/code/contexts``."""
    body: Dict[str, Any] = {}
    if language is not None:
        if not isinstance(language, str) or not language:
            raise ValueError("language must be a non-empty str (python, javascript or bash), got %r" % (language,))
        body["language"] = language
    if cwd is not None:
        if not isinstance(cwd, str) or not cwd:
            raise ValueError("cwd must be a non-empty str, got %r" % (cwd,))
        body["cwd"] = cwd
    return body


def interrupt_body(context: Optional[ContextArg]) -> Dict[str, Any]:
    """The body of ``POST /v1/sandboxes/{id}/code/interrupt``."""
    return {} if context is None else {"context_id": context_id(context)}


def code_context(data: Any) -> CodeContext:
    """The context of an answer; PandaError when it has no id."""
    if not isinstance(data, Mapping) or not isinstance(data.get("id"), str) or not data["id"]:
        raise PandaError("the server's answer is no code context: %r" % (data,))
    return CodeContext.from_dict(data)


def code_contexts(data: Any) -> List[CodeContext]:
    """The contexts of ``GET /v1/sandboxes/{id}/code/contexts``."""
    items = data.get("contexts") if isinstance(data, Mapping) else None
    if not isinstance(items, list):
        raise PandaError("the server's answer has no contexts list: %r" % (data,))
    return [CodeContext.from_dict(c) for c in items if isinstance(c, Mapping)]


def interrupted(data: Any) -> bool:
    """The ``interrupted`` of an interrupt's answer."""
    return isinstance(data, Mapping) and data.get("interrupted") is True


class CodeRun:
    """The events of one cell's stream, fed one at a time (:meth:`add`) as
    they arrive; :meth:`execution` once :attr:`done`, or :meth:`unfinished`
    when the stream ended before its ``end`` event.

    ``on_stdout``, ``on_stderr`` and ``on_result`` are the caller's
    callbacks, plain or async: :meth:`add` says which one to call with what,
    and the caller calls it (so callbacks run in the order of the events).
    """

    def __init__(
        self,
        sandbox_id: str,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        on_result: Optional[ResultCallback] = None,
    ) -> None:
        self._sandbox_id = sandbox_id
        self._on = {"stdout": on_stdout, "stderr": on_stderr, "result": on_result}
        self._results: List[Result] = []
        self._stdout: List[str] = []
        self._stderr: List[str] = []
        self._error: Optional[ExecutionError] = None
        self._end: Optional[Mapping[str, Any]] = None
        self._last: Optional[str] = None  # type of the last event

    @property
    def done(self) -> bool:
        """The ``end`` event arrived."""
        return self._end is not None

    def add(self, ev: Any) -> Optional[Tuple[Callable[..., Any], Any]]:
        """Take one event; return ``(callback, argument)`` to call, or ``None``.

        Raises :class:`PandaError` for an event that is no object or a known
        event with fields of the wrong type; events of unknown types are
        skipped (a newer server may send more).
        """
        if not isinstance(ev, Mapping):
            raise _malformed("line (no JSON object)", ev)
        if self._end is not None:
            return None
        t = ev.get("type")
        self._last = t if isinstance(t, str) else None
        arg: Any
        if t in ("stdout", "stderr"):
            text = ev.get("text")
            if not isinstance(text, str):
                raise _malformed("%s event (text is no string)" % t, ev)
            (self._stdout if t == "stdout" else self._stderr).append(text)
            arg = text
        elif t == "result":
            arg = Result.from_dict(ev)
            self._results.append(arg)
        elif t == "error":
            if isinstance(ev.get("error"), Mapping) and "name" not in ev:
                # An API error inside the stream (as exec streams send them).
                raise _errors.error_from_body(ev["error"])
            self._error = ExecutionError.from_dict(ev)
            return None
        elif t == "end":
            count = ev.get("execution_count")
            if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
                raise _malformed("end event (execution_count is no integer)", ev)
            self._end = ev
            return None
        else:
            return None
        cb = self._on[t]
        return None if cb is None else (cb, arg)

    def execution(self) -> Execution:
        """The :class:`Execution` of a stream that reached its ``end``."""
        end = self._end or {}
        count = end.get("execution_count")
        ctx = end.get("context_id")
        dur = end.get("duration_ms")
        return Execution(
            results=list(self._results),
            logs=Logs(list(self._stdout), list(self._stderr)),
            error=self._error,
            execution_count=count if isinstance(count, int) and not isinstance(count, bool) else None,
            truncated=end.get("truncated") is True,
            context_id=ctx if isinstance(ctx, str) else "",
            duration_ms=int(dur) if isinstance(dur, (int, float)) and not isinstance(dur, bool) else 0,
        )

    def unfinished(self) -> Execution:
        """The outcome of a stream that ended without its ``end`` event: raises,
        unless the server ended it for the cell's timeout.

        A last ``TimeoutError`` event is the server interrupting a cell its
        guest let run past the timeout: that is the cell's outcome, an
        :class:`Execution` whose error says so. A last ``GuestError`` event
        (the sandbox's code server failed or broke its protocol) raises a
        :class:`PandaError` with code ``guest_error``; a stream that just
        stopped, a :class:`PandaConnectionError`.
        """
        if self._last == "error" and self._error is not None:
            if self._error.name == "TimeoutError":
                return self.execution()
            if self._error.name == "GuestError":
                msg = "the code interpreter of sandbox %s failed during the cell: %s" % (self._sandbox_id, self._error.value or "no reason given")
                raise _errors.error_from_body({"code": "guest_error", "message": msg})
        raise PandaConnectionError(
            "the code stream of sandbox %s ended before the cell's end (server restarted or connection cut)" % self._sandbox_id
        )

    def malformed_line(self, e: ValueError) -> PandaError:
        """The error to raise for a line of the stream that is no JSON."""
        return PandaError("the code stream of sandbox %s has a line that is no JSON: %s" % (self._sandbox_id, e))
