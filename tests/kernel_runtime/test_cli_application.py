"""run-application's configuration: the package's config.yaml, then -D, then the active
ResourceManager; --taskmanagers as the slots kept started; bad values named."""
from __future__ import annotations

import click
import pytest

from cluster.conf import ConfigError
from kernel_runtime.cli.application import application_configuration, read_package
from kernel_runtime.cli.options import dynamic_properties


def test_package_config_then_dynamic_then_process_provider(tmp_path):
    (tmp_path / "job.py").write_text("def main(argv=None): pass\n")
    (tmp_path / "config.yaml").write_text("parallelism.default: 3\nrest.port: 9999\n")
    script, config = read_package(tmp_path)
    assert script == tmp_path / "job.py"
    conf = application_configuration(config, dynamic_properties(("parallelism.default=4",)), "config.yaml",
                                     taskmanagers=2, slots=3)
    assert conf["parallelism.default"] == 4 and conf["rest.port"] == 9999 and conf["jobmanager.rpc.port"] == 0
    assert conf["resourcemanager.provider"] == "process"
    assert conf["taskmanager.numberOfTaskSlots"] == 3 and conf["slotmanager.number-of-slots.min"] == 6
    assert read_package(tmp_path / "job.py") == (tmp_path / "job.py", {})


def test_bad_packages_and_values_are_named(tmp_path):
    with pytest.raises(click.BadParameter, match="has no job.py"):
        read_package(tmp_path)
    with pytest.raises(click.BadParameter, match="not key=value"):
        dynamic_properties(("parallelism.default",))
    with pytest.raises(ConfigError, match="'slotmanager.number-of-slots.max' in -D"):
        application_configuration({}, {"slotmanager.number-of-slots.max": "many"}, "config.yaml", None, None)
    with pytest.raises(ConfigError, match="number-of-slots.min \\(4\\) is above"):
        application_configuration({}, {"slotmanager.number-of-slots.max": 3}, "config.yaml", 2, 2)
