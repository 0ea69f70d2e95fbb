"""Options shared by the ``streamlab`` commands."""
from __future__ import annotations

from typing import Any

import click
import yaml

dynamic_option = click.option("-D", "dynamic", multiple=True, metavar="KEY=VALUE",
                              help="A configuration key (Flink's names), as Flink's -D; may be repeated.")


def dynamic_properties(items: tuple[str, ...]) -> dict[str, Any]:
    """Flink's ``-D key=value`` options as a dict, each value read as YAML (numbers, booleans)."""
    config: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not key=value", param_hint="-D")
        config[key.strip()] = yaml.safe_load(value)
    return config
