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
def demo() -> None:
    """Run DESIGN.md §8's worked example through the broker and print the final balances."""
    from connectors.demo import run_demo

    raise typer.Exit(run_demo())


if __name__ == "__main__":
    app()
