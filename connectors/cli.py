"""The `ledger` command line."""
from __future__ import annotations

import sys

import typer

from streams import config

app = typer.Typer(help="A streaming double-entry ledger on Apache Kafka.", no_args_is_help=True)
topics_app = typer.Typer(help="Create, check and delete the ledger's topics.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")


@topics_app.command("create")
def topics_create() -> None:
    """Create the ledger's topics (idempotent) and check they are co-partitioned."""
    from connectors.admin import CoPartitioningError, create_topics

    settings = config.load()
    try:
        reports = create_topics(settings)
    except CoPartitioningError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    for r in reports:
        typer.echo(f"{r.name:40} {r.partitions} partitions {'created' if r.created else 'exists'}")


@topics_app.command("delete")
def topics_delete(yes: bool = typer.Option(False, "--yes", help="Confirm deletion.")) -> None:
    """Delete the ledger's topics under the configured prefix."""
    from connectors.admin import delete_topics

    if not yes:
        typer.echo("refusing without --yes", err=True)
        raise typer.Exit(2)
    delete_topics(config.load())


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(ctx: typer.Context) -> None:
    """Run a partition worker (extra arguments go to Faust's worker command)."""
    from streams.app import app as faust_app

    sys.argv = ["ledger", "worker", "-l", "info", "--without-web", *ctx.args]
    faust_app.main()


@app.command()
def verify() -> None:
    """Check the oracles of DESIGN.md §2 over the topics (run it when the ledger is quiescent)."""
    from projections.verify import format_report, verify as run_verify

    report = run_verify(config.load())
    typer.echo(format_report(report))
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def loadgen(
    rate: float = typer.Option(200.0, help="Commands per second."),
    count: int = typer.Option(0, help="Commands to send; 0 = until interrupted."),
    users: int = typer.Option(200, help="Number of users (one USD account each)."),
    seed: int = typer.Option(7, help="Random seed: the same seed sends the same commands."),
) -> None:
    """Send a realistic, seedable mix of commands (deposits, transfers, holds, captures, invalid ones)."""
    import time

    from connectors.client import LedgerClient
    from connectors.loadgen import LoadGenerator, Mix

    client = LedgerClient(config.load(), "loadgen")
    gen = LoadGenerator(client, seed=seed, mix=Mix(users=users), run_id=f"s{seed}")
    client.wait(gen.open_accounts(), 120)
    sent, start = 0, time.monotonic()
    try:
        while count == 0 or sent < count:
            gen.next_command()
            sent += 1
            ahead = sent / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
            if sent % 1000 == 0:
                typer.echo(f"loadgen: {sent} commands sent ({sent / (time.monotonic() - start):.0f}/s)")
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
        typer.echo(f"loadgen: {sent} commands in {time.monotonic() - start:.1f} s")


@app.command()
def demo() -> None:
    """Run DESIGN.md §8's worked example through the broker and print the final balances."""
    from connectors.demo import run_demo

    raise typer.Exit(run_demo())


if __name__ == "__main__":
    app()
