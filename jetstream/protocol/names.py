"""Validation of names: streams, groups, NATS subjects, labels, and label selectors.

Theory of operation: every name a user gives is checked once, where it enters (a request, a
config file, a CLI flag), against the syntax declared here, so the layers below can take names
as they come. Each check has two forms: `is_*` predicates for codecs that raise their own
error, and `check_*` functions that raise InvalidStreamConfig naming the field.

    stream or group name  [A-Za-z0-9_-]{1,64}
    NATS subject          tokens separated by "."; no empty token, no whitespace or control
                          character; "*" only as a whole token, ">" only as the whole last
                          token; at most 255 characters
    partition subject     partition 0 reads the stream's subject, partition p > 0 reads
                          "<subject>.<p>" (so a subject ending in ">" allows one partition)
    label key or value    [A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?   (1..63 characters)
    selector              requirements separated by ",":  key=value, key==value, key!=value,
                          key in (v1,v2), key notin (v1,v2), key (exists), !key (absent).
                          Kubernetes semantics: != and notin also match a missing key; the
                          empty selector matches everything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NoReturn, TypeGuard

from jetstream.errors import InvalidStreamConfig

STREAM_NAME_CHARS_MAX = 64
SUBJECT_CHARS_MAX = 255
LABEL_CHARS_MAX = 63
#: Labels on one stream.
LABELS_MAX = 64
#: Longest selector text, and most requirements and values in one.
SELECTOR_CHARS_MAX = 4096
SELECTOR_REQUIREMENTS_MAX = 64
SELECTOR_VALUES_MAX = 64

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
assert STREAM_NAME_CHARS_MAX == 64
_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
assert LABEL_CHARS_MAX == 1 + 61 + 1
# Whitespace and control characters would break the NATS protocol line.
_SUBJECT_BAD_CHAR = re.compile(r"[\s\x00-\x1f\x7f]")


# -- streams and groups ------------------------------------------------------------------------


def is_stream_name(name: object) -> TypeGuard[str]:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def check_stream_name(name: object, field: str = "name") -> str:
    if not is_stream_name(name):
        raise InvalidStreamConfig(f"{field} must match [A-Za-z0-9_-]{{1,64}}, got {name!r}",
                                  field=field)
    return name


is_group_name = is_stream_name


def check_group_name(name: object, field: str = "group") -> str:
    return check_stream_name(name, field)


# -- subjects ----------------------------------------------------------------------------------


def is_subject(subject: object, *, wildcards: bool = True) -> TypeGuard[str]:
    """A valid NATS subject; with `wildcards` False, a literal one (a publish subject)."""
    if not isinstance(subject, str) or not 0 < len(subject) <= SUBJECT_CHARS_MAX:
        return False
    if _SUBJECT_BAD_CHAR.search(subject):
        return False
    tokens = subject.split(".")
    last = len(tokens) - 1
    for i, token in enumerate(tokens):
        if not token:
            return False
        if token in ("*", ">"):
            if not wildcards or (token == ">" and i != last):
                return False
        elif "*" in token or ">" in token:
            return False
    return True


def check_subject(subject: object, field: str = "subject", *, wildcards: bool = True) -> str:
    if not is_subject(subject, wildcards=wildcards):
        kind = "NATS subject" if wildcards else "NATS subject without wildcards"
        raise InvalidStreamConfig(f"{field} must be a valid {kind} (dot-separated tokens, at "
                                  f"most {SUBJECT_CHARS_MAX} characters), got {subject!r}",
                                  field=field)
    return subject


def ends_with_full_wildcard(subject: str) -> bool:
    return subject == ">" or subject.endswith(".>")


def check_partitioned_subject(subject: str, partitions: int, field: str = "subject") -> None:
    """A stream with more than one partition cannot read a subject ending in ">": it would
    also match the subjects of partitions 1.."""
    check_subject(subject, field)
    if partitions > 1 and ends_with_full_wildcard(subject):
        raise InvalidStreamConfig(f"{field} {subject!r} ends in '>': a stream with "
                                  f"{partitions} partitions needs a subject without it",
                                  field=field)


def partition_subject(subject: str, partition: int) -> str:
    """The NATS subject partition `partition` of a stream on `subject` reads."""
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise InvalidStreamConfig(f"partition must be a non-negative integer, got "
                                  f"{partition!r}", field="partition")
    check_subject(subject)
    if partition == 0:
        return subject
    if ends_with_full_wildcard(subject):
        raise InvalidStreamConfig(f"subject {subject!r} ends in '>' and cannot have partition "
                                  f"{partition}", field="subject")
    return check_subject(f"{subject}.{partition}")


# -- labels ------------------------------------------------------------------------------------


def is_label(text: object) -> TypeGuard[str]:
    return isinstance(text, str) and _LABEL.fullmatch(text) is not None


def check_labels(labels: object, field: str = "labels") -> dict[str, str]:
    """A copy of `labels` after checking every key and value."""
    if not isinstance(labels, Mapping):
        raise InvalidStreamConfig(f"{field} must be a map of label keys to values", field=field)
    if len(labels) > LABELS_MAX:
        raise InvalidStreamConfig(f"{field} has {len(labels)} labels, more than {LABELS_MAX}",
                                  field=field)
    for key, value in labels.items():
        if not is_label(key):
            raise InvalidStreamConfig(f"label key {key!r} in {field} is invalid", field=field)
        if not is_label(value):
            raise InvalidStreamConfig(f"label value {value!r} of {key!r} in {field} is "
                                      "invalid", field=field)
    return dict(labels)


# -- selectors ---------------------------------------------------------------------------------

Operator = Literal["=", "!=", "in", "notin", "exists", "!"]

# One lexeme: an operator or a word of label characters. Anything else is an error.
_TOKEN = re.compile(r"\s*(?:(?P<op>==|!=|=|!|\(|\)|,)|(?P<word>[-A-Za-z0-9_.]+))")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def __call__(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "exists":
            return self.key in labels
        if op == "!":
            return self.key not in labels
        value = labels.get(self.key)
        if op == "=" or op == "in":
            return value is not None and value in self.values
        return value is None or value not in self.values  # != and notin

    def __str__(self) -> str:
        if self.operator == "exists":
            return self.key
        if self.operator == "!":
            return f"!{self.key}"
        if self.operator in ("=", "!="):
            (value,) = self.values
            return f"{self.key}{self.operator}{value}"
        return f"{self.key} {self.operator} ({','.join(sorted(self.values))})"


@dataclass(frozen=True, slots=True)
class Selector:
    """A predicate over a labels dict: true when every requirement holds."""

    requirements: tuple[Requirement, ...] = ()

    def __call__(self, labels: Mapping[str, str]) -> bool:
        return all(req(labels) for req in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(req) for req in self.requirements)


def parse_selector(text: str, field: str = "selector") -> Selector:
    """Parse `app=shop,env in (prod,stage),tier!=db,!legacy`. Raises InvalidStreamConfig."""
    if not isinstance(text, str) or len(text) > SELECTOR_CHARS_MAX:
        raise InvalidStreamConfig(f"{field} must be a string of at most {SELECTOR_CHARS_MAX} "
                                  "characters", field=field)
    return _Parser(text, field).selector()


class _Parser:
    def __init__(self, text: str, field: str) -> None:
        self.text = text
        self.field = field
        self.tokens = self._lex()
        self.i = 0

    def _lex(self) -> list[str]:
        tokens: list[str] = []
        pos = 0
        text = self.text.rstrip()
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None:
                self._fail(f"unexpected character {text[pos:].lstrip()[:1]!r}")
            tokens.append(match.group("op") or match.group("word"))
            pos = match.end()
        return tokens

    def _fail(self, why: str) -> NoReturn:
        raise InvalidStreamConfig(f"invalid {self.field} {self.text!r}: {why}",
                                  field=self.field)

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _next(self, expected: str) -> str:
        token = self._peek()
        if token is None:
            self._fail(f"expected {expected} at the end")
        self.i += 1
        return token

    def _label(self, what: str) -> str:
        token = self._next(what)
        if not is_label(token):
            self._fail(f"expected {what}, got {token!r}")
        return token

    def selector(self) -> Selector:
        if not self.tokens:
            return Selector()
        requirements = [self._requirement()]
        while self._peek() is not None:
            if self._next("','") != ",":
                self._fail(f"expected ',' before {self.tokens[self.i - 1]!r}")
            requirements.append(self._requirement())
        if len(requirements) > SELECTOR_REQUIREMENTS_MAX:
            self._fail(f"more than {SELECTOR_REQUIREMENTS_MAX} requirements")
        return Selector(tuple(requirements))

    def _requirement(self) -> Requirement:
        if self._peek() == "!":
            self.i += 1
            return Requirement(self._label("a label key"), "!")
        key = self._label("a label key")
        op = self._peek()
        if op is None or op == ",":
            return Requirement(key, "exists")
        self.i += 1
        if op in ("=", "==", "!="):
            return Requirement(key, "!=" if op == "!=" else "=",
                               frozenset([self._label("a label value")]))
        if op in ("in", "notin"):
            return Requirement(key, "in" if op == "in" else "notin", self._values())
        self._fail(f"expected an operator after {key!r}, got {op!r}")

    def _values(self) -> frozenset[str]:
        if self._next("'('") != "(":
            self._fail("expected '(' after in/notin")
        values = [self._label("a label value")]
        while (token := self._next("')'")) == ",":
            values.append(self._label("a label value"))
        if token != ")":
            self._fail(f"expected ',' or ')', got {token!r}")
        if len(values) > SELECTOR_VALUES_MAX:
            self._fail(f"more than {SELECTOR_VALUES_MAX} values in a set")
        return frozenset(values)
