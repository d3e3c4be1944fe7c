"""What every way of running a command shares (``exec`` and ``sb.commands``,
blocking and asyncio): the command part of its request body, and the
gathering of its streamed output into an :class:`ExecResult`.

Pure: no I/O, so :mod:`pandastack.sandbox`, :mod:`pandastack.processes` and
their asyncio twins build the same bodies and the same results.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from .models import ExecResult

#: A shell command line (run with ``bash -l -c``, a login bash whose profiles do not override ``env``; ``/bin/sh -c`` without bash) or an argv list (run directly).
Command = Union[str, Sequence[str]]


def check_str_map(name: str, m: Optional[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    """A copy of ``m`` (``env``, ``metadata``...) once every key and value is a ``str``; ``None`` stays ``None``."""
    if m is None:
        return None
    if not isinstance(m, Mapping):
        raise TypeError("%s must be a mapping of str to str" % name)
    out: Dict[str, str] = {}
    for k, v in m.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("%s must map str to str, got %r: %r" % (name, k, v))
        out[k] = v
    return out


def command_body(
    cmd: Command,
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    user: Optional[str],
    timeout_seconds: Optional[float],
) -> Dict[str, Any]:
    """The ``cmd`` or ``argv``, ``env``, ``cwd``, ``user`` and ``timeout_seconds``
    of an exec or process request, in that order; values left out are ``None``."""
    body: Dict[str, Any] = {}
    if isinstance(cmd, str):
        if not cmd:
            raise ValueError("cmd is empty")
        body["cmd"] = cmd
    elif isinstance(cmd, (bytes, bytearray)):
        raise TypeError("cmd must be str or a list of str, not bytes")
    else:
        argv = list(cmd)
        if not argv:
            raise ValueError("argv is empty")
        if not all(isinstance(a, str) for a in argv):
            raise TypeError("every argv element must be a str: %r" % (argv,))
        body["argv"] = argv
    e = check_str_map("env", env)
    if e is not None:
        body["env"] = e
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        if not isinstance(user, str):
            raise TypeError("user must be a str, not %s" % type(user).__name__)
        body["user"] = user
    if timeout_seconds is not None:
        if timeout_seconds < 0:
            raise ValueError("timeout_seconds must be >= 0 (0: no timeout)")
        body["timeout_seconds"] = timeout_seconds
    return body


class Output:
    """The output of a command as its stream delivers it: :meth:`add` each
    piece, then :meth:`result` with how it ended. ``on_stdout`` and
    ``on_stderr`` are the caller's callbacks, plain or async: :meth:`add`
    says which one to call, and the caller calls it."""

    def __init__(self, on_stdout: Optional[Callable[[str], Any]] = None, on_stderr: Optional[Callable[[str], Any]] = None) -> None:
        self.out: List[str] = []
        self.err: List[str] = []
        self.truncated = False
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr

    def add(self, stream: str, data: str, dropped: int = 0) -> Optional[Callable[[str], Any]]:
        """Keep ``data`` of ``stream`` (anything but ``"stderr"`` is stdout), or
        note that ``dropped`` bytes are lost. Return the callback to call with
        ``data``: ``None`` when there is none or ``data`` is empty."""
        if dropped:
            self.truncated = True
            return None
        if stream == "stderr":
            self.err.append(data)
            return self._on_stderr if data else None
        self.out.append(data)
        return self._on_stdout if data else None

    def result(self, end: ExecResult) -> ExecResult:
        """``end`` (the stream's ``exit`` event) with the output kept."""
        return dataclasses.replace(end, stdout="".join(self.out), stderr="".join(self.err), truncated=end.truncated or self.truncated)
