"""The root of the error tree, and the root of configuration errors."""

from __future__ import annotations

from typing import Any, ClassVar


class JetstreamError(Exception):
    """Base of every error Jetstream raises on purpose."""

    code: ClassVar[str] = "INTERNAL"
    #: True when the same request may succeed if simply retried later.
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "", **fields: Any) -> None:
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)
        super().__init__(message or self.__class__.__doc__ or self.code)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: code, message and the data fields."""
        return {"code": self.code, "message": str(self), **self.fields}

    def __reduce__(self) -> tuple[Any, ...]:
        # Worker processes hand errors back pickled: the message and the fields travel,
        # whatever the subclass's __init__ takes.
        return (_rebuilt, (type(self), str(self), dict(self.__dict__)))


def _rebuilt(cls: type[JetstreamError], message: str, state: dict[str, Any]) -> JetstreamError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class InvalidConfig(JetstreamError):
    """A configuration value is missing, of the wrong type or out of its range."""

    code = "INVALID_CONFIG"
