"""How configuration is read: a YAML file of keys, and each value in Flink's notations.

Durations ("500 ms", "10 s"), memory sizes ("64 mb", binary units), port ranges ("50100-50200"),
enums, lists and Spark's own settings: one parser per kind of value. A parser takes what YAML or a
user gave and returns the typed value, or raises ValueError saying what it expected;
cluster.conf turns that into a ConfigError naming the key and where it came from. The options
(cluster.conf.options) pick one parser each.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Container, Iterator, Mapping, Optional

import yaml


class ConfigError(ValueError):
    """An unknown key or a value of the wrong kind, naming the key and where it came from."""

    restart_cannot_fix = True  # a job that fails on one fails again (cluster.common.failures)


def load_yaml(path: Path) -> Mapping[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path} must be a map of configuration keys")
    return data

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|milli|millis|s|sec|secs|second|seconds|min|m|minute|minutes|h|hour|hours)?\s*$")
_UNIT_MS = {None: 1, "ms": 1, "milli": 1, "millis": 1, "s": 1000, "sec": 1000, "secs": 1000,
            "second": 1000, "seconds": 1000, "m": 60000, "min": 60000, "minute": 60000,
            "minutes": 60000, "h": 3600000, "hour": 3600000, "hours": 3600000}




def parse_duration_ms(value: Any) -> int:
    """Flink's duration notation ("500 ms", "10 s", "1 min") or a plain number of milliseconds."""
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(value, (int, float)):
        return int(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError('a duration such as "500 ms", "10 s" or "1 min"')
    return int(float(m.group(1)) * _UNIT_MS[m.group(2)])


def positive_duration_ms(value: Any) -> int:
    ms = parse_duration_ms(value)
    if ms <= 0:
        raise ValueError("a duration above 0")
    return ms


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
# Flink's MemorySize units: powers of 1024 whatever the spelling ("64 mb" is 64 MiB)
_UNIT_BYTES = {"": 1, "b": 1, "bytes": 1, "k": 1 << 10, "kb": 1 << 10, "kibibytes": 1 << 10,
               "m": 1 << 20, "mb": 1 << 20, "mebibytes": 1 << 20, "g": 1 << 30, "gb": 1 << 30,
               "gibibytes": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tebibytes": 1 << 40}


def parse_size_bytes(value: Any) -> int:
    """Flink's memory size notation ("64 mb", "512k", "1 gb") or a plain number of bytes."""
    if isinstance(value, bool):
        raise ValueError("a size, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size >= 0")
        return value
    m = _SIZE.match(str(value))
    if not m or m.group(2).lower() not in _UNIT_BYTES:
        raise ValueError('a size such as "64 mb", "512 kb" or a number of bytes')
    return int(float(m.group(1)) * _UNIT_BYTES[m.group(2).lower()])


def format_size(size: int) -> str:
    """A byte count as a person reads it, in Flink's binary units ("63.9 mb")."""
    for unit, scale in (("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def size_in(minimum: int = 0, maximum: Optional[int] = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        size = parse_size_bytes(value)
        if size < minimum or (maximum is not None and size > maximum):
            if maximum is None:
                raise ValueError(f"a size of at least {format_size(minimum)}")
            raise ValueError(f"a size between {format_size(minimum)} and {format_size(maximum)} ({maximum} bytes)")
        return size
    return parse


def seconds(value: Any) -> int:
    """Flink's jobstore.expiration-time: a plain number is seconds; a duration ("1 h") also works."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    seconds = int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else parse_duration_ms(value) // 1000
    if seconds < 1:
        raise ValueError("at least 1 second")
    return seconds


def int_in(minimum: Optional[int] = None, maximum: Optional[int] = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError("an integer")
        try:
            number = int(value)
        except ValueError:
            raise ValueError("an integer") from None
        if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
            raise ValueError(f"an integer in [{minimum}, {maximum if maximum is not None else '...'}]")
        return number
    return parse


def non_empty_str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("a non-empty string")
    return value


def str_or_empty(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError("a string")
    return value


def str_list(value: Any) -> list[str]:
    """A YAML list of strings, or Flink's notation for lists in one string ("a;b", also "a,b")."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [part for part in re.split(r"[;,]", value)]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("a list of strings")
    return [v.strip() for v in value if v.strip()]


_PORT_RANGE_HELP = ('a port, a list of ports ("50100,50101"), a range ("50100-50200") or a combination of '
                    'both, each port in [0, 65535] (0: any free port)')


def port_range(value: Any) -> str:
    """Flink's port-range notation (rest.bind-port), kept as its canonical text; ``port_candidates``
    reads it. Empty: the key is not set (rest.port is bound)."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(_PORT_RANGE_HELP)
    parts = []
    for part in str(value).split(","):
        low, dash, high = (p.strip() for p in part.partition("-"))
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{_PORT_RANGE_HELP}; {part.strip()!r} is not one")
        first, last = int(low), int(high) if dash else int(low)
        if last > 65535:
            raise ValueError(f"{_PORT_RANGE_HELP}; {part.strip()!r} is beyond 65535")
        if first > last:
            raise ValueError(f"{_PORT_RANGE_HELP}; the range {part.strip()!r} runs backwards")
        parts.append(f"{first}-{last}" if dash else str(first))
    return ",".join(parts)


def port_candidates(spec: str) -> Iterator[int]:
    """The ports of a canonical port range (``port_range``), in the order a server tries them."""
    for part in spec.split(","):
        low, _, high = part.partition("-")
        yield from range(int(low), int(high or low) + 1)


def constant_of(*choices: str) -> Callable[[Any], str]:
    """An enum constant as Flink writes it (EXACTLY_ONCE; "exactly-once" reads the same)."""
    def parse(value: Any) -> str:
        text = str(value).upper().replace("-", "_") if isinstance(value, str) else ""
        if text not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return text
    return parse


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError("true or false")


def one_of(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).lower() if not isinstance(value, bool) else ""
        if text not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return text
    return parse


# Spark keys that streamlab keys set: one way to say each, so that the two cannot disagree
_SPARK_KEYS_OF_OURS = {"spark.master": "taskmanager.spark.master",
                       "spark.driver.memory": "taskmanager.spark.driver-memory",
                       "spark.executor.cores": "taskmanager.spark.executor-cores",
                       "spark.executor.memory": "taskmanager.spark.executor-memory",
                       "spark.cores.max": "taskmanager.spark.cores-max"}

_SPARK_MASTER = re.compile(r"^(local(\[(\*|[1-9]\d*)(,\d+)?\])?"
                           r"|spark://[^\s:/,]+:\d{1,5}(,[^\s:/,]+:\d{1,5})*"
                           r"|k8s://\S+|yarn)$")


def spark_master(value: Any) -> str:
    if not isinstance(value, str) or not _SPARK_MASTER.match(value.strip()):
        raise ValueError("a Spark master: local, local[N], local[*], spark://HOST:PORT (a standalone cluster; "
                         "several masters comma-separated), k8s://https://HOST:PORT or yarn")
    return value.strip()


def spark_memory(value: Any) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not re.match(r"^\d+[kmgt]?$", value.strip().lower()):
        raise ValueError('a JVM memory size as Spark writes it, such as "512m" or "2g"')
    return value.strip().lower()


def spark_properties(value: Any) -> dict[str, str]:
    """A map of Spark's own settings by Spark's names (nested maps joined with dots)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("a map of Spark settings, such as {spark.executor.instances: 4}")
    return dict(sorted(_spark_property(key, raw) for key, raw in flatten(value).items()))


def _spark_property(key: str, value: Any) -> tuple[str, str]:
    if not key.startswith("spark."):
        raise ValueError(f"Spark settings, whose names start with 'spark.' (not {key!r})")
    if key in _SPARK_KEYS_OF_OURS:
        raise ValueError(f"no {key} here: {_SPARK_KEYS_OF_OURS[key]!r} sets it")
    if isinstance(value, bool):
        return key, str(value).lower()
    if not isinstance(value, (str, int, float)) or value == "":
        raise ValueError(f"a string or a number for {key}")
    return key, str(value)

def number_at_least(minimum: float) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError("a number")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError("a number") from None
        if number < minimum:
            raise ValueError(f"a number >= {minimum}")
        return number
    return parse


def fraction(value: Any) -> float:
    """A number from 0 to 1."""
    number = number_at_least(0.0)(value)
    if number > 1.0:
        raise ValueError("a number from 0 to 1")
    return number


def flatten(data: Mapping, prefix: str = "", keep: Container[str] = ()) -> dict[str, Any]:
    # Flink accepts both "a.b.c: v" and nested maps; so do we. A map under a key in ``keep`` (a
    # map-valued option) stays a map.
    flat: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and full not in keep:
            flat.update(flatten(value, full + ".", keep))
        else:
            flat[full] = value
    return flat
