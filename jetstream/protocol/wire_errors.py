"""Errors on the wire: the header an error travels in, and the error a header stands for.

Theory of operation: an error travels as a map (the header of an ERROR frame, or the body
of an error ack): the error's `to_dict()`, its stable code, message and data fields, with
any value msgpack cannot carry sent as its str(). `error_from_header` turns it back into the
class that owns the code (a registry built by walking the JetstreamError tree), built from
the same fields by its constructor, so a caller catches `NotLeader` and reads its fields
whichever side raised it; a code unknown here becomes a RemoteError carrying the fields. A
sender of another version may send fields a constructor does not take: the error keeps its
class (callers test it and its `retriable`) and stores them as they are. No field can
overwrite an attribute of the exception.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Mapping
from typing import Any

from jetstream.errors import JetstreamError, ProtocolError, RemoteError
from jetstream.protocol.fields import ERROR_CODE_CHARS_MAX

# Field names a remote error may not set: they would overwrite attributes of the exception.
_RESERVED_FIELDS = frozenset(dir(RemoteError)) | {"self", "fields", "code", "message"}
_WIRE_SCALARS = (str, int, float, bool, type(None), bytes)


def error_header(exc: JetstreamError) -> dict[str, Any]:
    """The header of an error frame: `exc.to_dict()`, with any field value that msgpack cannot
    carry (not a scalar, list or str-keyed map of them) sent as its str()."""
    return {k: _wire_value(v) for k, v in exc.to_dict().items()}


def _wire_value(value: object) -> object:
    if isinstance(value, _WIRE_SCALARS):
        return value
    if isinstance(value, list | tuple):
        return [_wire_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _wire_value(v) for k, v in value.items()}
    return str(value)


def error_registry() -> dict[str, type[JetstreamError]]:
    """Stable code -> the class that declares it. A subclass that inherits its parent's code
    (FrameError) is not listed: the parent stands for it. Walked on each call, so error
    classes defined later are found."""
    registry: dict[str, type[JetstreamError]] = {}
    queue: deque[type[JetstreamError]] = deque([JetstreamError])
    while queue:  # breadth first, so a parent wins over a subclass that repeats its code
        cls = queue.popleft()
        queue.extend(cls.__subclasses__())
        if "code" in vars(cls):
            registry.setdefault(cls.code, cls)
    return registry


_known: dict[str, type[JetstreamError]] = {}


def _error_class(code: str) -> type[JetstreamError] | None:
    """error_registry()[code], walked again only for a code not seen before (an error class
    defined since, or a code this side does not know)."""
    cls = _known.get(code)
    if cls is None:
        _known.update(error_registry())
        cls = _known.get(code)
    return cls


def error_from_header(header: Mapping[str, Any]) -> JetstreamError:
    """The error an error frame (or an error ack) carries: an instance of the class that owns
    its code, built from its fields by the class's constructor (or, when the fields do not fit
    it, a sender of another version, carrying them as they are); RemoteError when the code is
    unknown here. Raises ProtocolError when the header has no valid code or message."""
    if not isinstance(header, Mapping):
        raise ProtocolError("error header must be a map", field="error")
    code = header.get("code")
    message = header.get("message", "")
    if not isinstance(code, str) or not 0 < len(code) <= ERROR_CODE_CHARS_MAX:
        raise ProtocolError("error code must be a non-empty string of at most "
                            f"{ERROR_CODE_CHARS_MAX} characters", field="code")
    if not isinstance(message, str):
        raise ProtocolError("error message must be a string", field="message")
    data = {k: v for k, v in header.items()
            if isinstance(k, str) and k.isidentifier() and not k.startswith("_")
            and k not in _RESERVED_FIELDS}
    cls = _error_class(code)
    if cls is None:
        exc: JetstreamError = RemoteError(code, message, **data)
    else:
        exc = _rebuild(cls, code, message, data) or _bare(cls, message, data)
    if message and str(exc) != message:
        exc.args = (message,)  # the sender's words, even where a constructor words it anew
    return exc


def _rebuild(cls: type[JetstreamError], code: str, message: str,
             data: dict[str, Any]) -> JetstreamError | None:
    kwargs: dict[str, Any] = {}
    takes_any = False
    parameters = _parameters(cls)
    if parameters is None:
        return None
    for name, parameter in parameters.items():
        if parameter.kind is parameter.VAR_KEYWORD:
            takes_any = True
        elif parameter.kind is parameter.VAR_POSITIONAL:
            continue
        elif name == "message":
            kwargs[name] = message
        elif name == "code":
            kwargs[name] = code
        elif name in data:
            kwargs[name] = data[name]
        elif parameter.default is parameter.empty:
            return None  # a field the class needs is missing: not the class we know
    if takes_any:
        kwargs.update((k, v) for k, v in data.items() if k not in parameters)
    try:
        return cls(**kwargs)
    except Exception:  # the fields have types the constructor cannot use
        return None


_signatures: dict[type[JetstreamError], Mapping[str, inspect.Parameter] | None] = {}


def _parameters(cls: type[JetstreamError]) -> Mapping[str, inspect.Parameter] | None:
    """The constructor's parameters (looked up once a class: a fetch session's answer after
    a restart may carry hundreds of refusals), None when it has no signature."""
    if cls not in _signatures:
        try:
            _signatures[cls] = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            _signatures[cls] = None
    return _signatures[cls]


def _bare(cls: type[JetstreamError], message: str, data: dict[str, Any]) -> JetstreamError:
    # Keep the type (callers test it and its `retriable`) even when the constructor refuses
    # the fields: skip it and store them as the base class does.
    exc = cls.__new__(cls)
    JetstreamError.__init__(exc, message, **data)
    return exc
