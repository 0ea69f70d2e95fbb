"""What a message is: a frozen dataclass registered under its kebab-case ``op``.

Each class registers itself under its ``op``; ``Message.from_wire`` looks the op up, checks that
the fields are exactly the declared ones with the declared types, and refuses anything else. The
payload of data messages (Arrow IPC bytes) travels in extra frames, not in the dataclass. The
message types themselves are listed in cluster.protocol.messages (whose import registers them
all), one module per conversation.
"""
from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass
from typing import Any, ClassVar


class MalformedMessage(ValueError):
    """A frame that is not a valid, authenticated message; it is dropped, never handled."""


class Message:
    op: ClassVar[str]
    registry: ClassVar[dict[str, type["Message"]]] = {}
    _field_types: ClassVar[dict[str, Any]]

    def __init_subclass__(cls, op: str, **kwargs):
        super().__init_subclass__(**kwargs)
        if op in Message.registry:
            raise TypeError(f"duplicate message op {op!r}")
        cls.op = op
        Message.registry[op] = cls

    def to_wire(self) -> dict:
        wire = {name: getattr(self, name) for name in _field_types(type(self))}
        wire["op"] = self.op
        return wire

    @staticmethod
    def from_wire(wire: Any) -> "Message":
        if not isinstance(wire, dict):
            raise MalformedMessage(f"message is a {type(wire).__name__}, not a map")
        op = wire.get("op")
        cls = Message.registry.get(op) if isinstance(op, str) else None
        if cls is None:
            raise MalformedMessage(f"unknown op {op!r}")
        types = _field_types(cls)
        given = set(wire) - {"op"}
        if given != set(types):
            missing, extra = set(types) - given, given - set(types)
            raise MalformedMessage(f"{op}: missing fields {sorted(missing)}, unexpected {sorted(extra)}")
        for name, annotation in types.items():
            if not _conforms(wire[name], annotation):
                raise MalformedMessage(f"{op}: field {name!r} is not {annotation}")
        return cls(**{name: _decoded(wire[name], annotation) for name, annotation in types.items()})


def _field_types(cls) -> dict[str, Any]:
    cached = cls.__dict__.get("_field_types")
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
        cls._field_types = cached
    return cached


def _is_enum(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, enum.Enum)


def _decoded(value: Any, annotation: Any) -> Any:
    """A field's value as its type says: an enum's member from its value (a state travels as its
    name); anything else as it came."""
    return annotation(value) if _is_enum(annotation) else value


def _conforms(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if _is_enum(annotation):
        return isinstance(value, str) and value in annotation._value2member_map_
    if origin is typing.Union:
        return any(_conforms(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


# --------------------------------------------------------------------------- generic replies
@dataclass(frozen=True)
class Acknowledge(Message, op="acknowledge"):
    pass


@dataclass(frozen=True)
class ErrorResponse(Message, op="error-response"):
    message: str
