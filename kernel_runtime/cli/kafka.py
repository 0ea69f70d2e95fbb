"""``streamlab kafka start|stop``: the same single-node Kafka broker (KRaft) the tests use, for a
notebook or a script on this machine (kernel_runtime.deploy.kafka_broker)."""
from __future__ import annotations

from pathlib import Path

import click

from kernel_runtime.deploy.kafka_broker import KafkaBroker, KafkaSetupError, default_broker_dir

# in the cache ($XDG_CACHE_HOME/streamlab/kafka-broker): a broker's data is a scratch cluster
DEFAULT_DIR = default_broker_dir()


@click.group()
def kafka() -> None:
    """A local Apache Kafka broker (KRaft mode, jars from Maven Central)."""


@kafka.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
              show_default=True, help="Where the broker keeps its configuration, data and log.")
def start(directory: Path) -> None:
    """Start the broker and print its bootstrap address (127.0.0.1:PORT)."""
    try:
        running = KafkaBroker.from_dir(directory)
        if running.running():
            click.echo(running.bootstrap)  # already up: the same broker again
            return
    except KafkaSetupError:
        pass
    try:
        broker = KafkaBroker(directory).start()
    except KafkaSetupError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(broker.bootstrap)


@kafka.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
              show_default=True, help="The directory given to start.")
def stop(directory: Path) -> None:
    """Stop the broker started in --dir."""
    try:
        KafkaBroker.from_dir(directory).stop()
    except KafkaSetupError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"stopped the Kafka broker in {directory}")
