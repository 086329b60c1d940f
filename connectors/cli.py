"""The `ledger` command line."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

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
def verify(
    wait_s: float = typer.Option(0.0, "--wait", help="First wait up to this many seconds for quiescence."),
) -> None:
    """Check the oracles of DESIGN.md §2 over the topics (run it when the ledger is quiescent)."""
    from projections.verify import format_report, verify as run_verify, wait_quiescent

    settings = config.load()
    if wait_s and not wait_quiescent(settings, wait_s):
        typer.echo(f"warning: the workers have not caught up after {wait_s}s; checking anyway", err=True)
    report = run_verify(settings)
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
def submit(
    path: str = typer.Argument(..., help="A JSON Lines file of commands (see README), or - for stdin."),
    client_id: str = typer.Option("cli", help="Scopes the command ids."),
    timeout_s: float = typer.Option(60.0, "--timeout", help="Seconds to wait for all results."),
    as_json: bool = typer.Option(False, "--json", help="One JSON result per line instead of a summary."),
) -> None:
    """Send the commands of a JSON Lines file and wait for their results.

    Bad lines are reported with their line number and skipped; the good lines are still sent.
    Exit status: 0 when every line was valid and accepted, 1 otherwise.
    """
    import json
    from collections import Counter

    from rich.progress import Progress

    from connectors.client import LedgerClient, ResultTimeout
    from connectors.jsonl import parse_file

    lines = (sys.stdin if path == "-" else open(path, encoding="utf-8")).read().splitlines()
    good, bad = parse_file(lines)
    for number, error in bad:
        typer.echo(f"line {number}: {error}", err=True)
    client = LedgerClient(config.load(), client_id)
    try:
        sent = [(parsed.line, parsed.send(client)) for parsed in good]
        client.flush()
        results: dict[str, dict] = {}
        with Progress(transient=True, disable=as_json) as progress:
            task = progress.add_task("waiting for results", total=len(sent))
            try:
                for _, command_id in sent:
                    results[command_id] = client.result(command_id, timeout_s)
                    progress.advance(task)
            except ResultTimeout as exc:
                typer.echo(f"no result within {timeout_s}s for {len(exc.missing)} command(s); "
                           f"resubmitting the same file is safe (same ids)", err=True)
    finally:
        client.close()
    outcomes = Counter()
    for line, command_id in sent:
        result = results.get(command_id)
        if result is None:
            outcomes["no result"] += 1
            continue
        outcomes[result["reason"] or "accepted"] += 1
        if as_json:
            typer.echo(json.dumps({"line": line, **result}))
        elif result["outcome"] == "rejected":
            typer.echo(f"line {line}: {command_id} rejected: {result['reason']} ({result['detail']})")
    if not as_json:
        summary = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        typer.echo(f"{len(sent)} sent, {len(bad)} bad lines; {summary}")
    ok = not bad and outcomes.get("accepted", 0) == len(sent)
    raise typer.Exit(0 if ok else 1)


@app.command()
def tail(
    as_json: bool = typer.Option(False, "--json", help="Print each result as JSON."),
    from_start: bool = typer.Option(False, "--from-start", help="Start at the beginning of the results topic."),
) -> None:
    """Print results as they are published (Ctrl-C to stop)."""
    import json
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    from schemas.codec import codec

    settings = config.load()
    consumer = Consumer({**settings.kafka_config(), "group.id": f"tail-{uuid.uuid4()}", "enable.auto.commit": False})
    start = OFFSET_BEGINNING if from_start else OFFSET_END
    consumer.assign([TopicPartition(settings.topic("results"), p, start) for p in range(settings.partitions)])
    c = codec()
    try:
        while True:
            for msg in consumer.consume(500, timeout=0.2):
                if msg.error():
                    continue
                r = c.decode("result", msg.value())
                if as_json:
                    typer.echo(json.dumps(r))
                else:
                    outcome = r["outcome"] + (f" {r['reason']}: {r['detail']}" if r["reason"] else "")
                    dup = " (duplicate)" if r["duplicate"] else ""
                    typer.echo(f"{r['client_id']}/{r['command_id']}: {outcome}{dup}")
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


READ_DB = typer.Option(Path(".state/read.db"), "--db", envvar="LEDGER_READ_DB", help="SQLite read store.")


@app.command()
def projector(db: Path = READ_DB) -> None:
    """Project balances, history and results into the read store until interrupted."""
    from projections.projector import main

    raise typer.Exit(main(config.load(), db))


@app.command()
def replay(
    into: Optional[str] = typer.Option(None, help="Fresh store to build (default: a temp file)."),
    against: Optional[str] = typer.Option(None, help="Live store to compare with; exit 1 on mismatch."),
    from_offsets: Optional[str] = typer.Option(None, help="e.g. history:0=120,results:*=0"),
    from_time: Optional[str] = typer.Option(None, help="ISO 8601 or epoch ms"),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Rebuild the read projection from the topics and compare its hash with a live store."""
    from projections.replay import run_cli

    raise typer.Exit(run_cli(config.load(), into, against, from_offsets, from_time, progress))


@app.command()
def api(
    db: Path = READ_DB,
    host: str = "127.0.0.1",
    port: int = typer.Option(8080, envvar="LEDGER_API_PORT"),
    with_projector: bool = typer.Option(True, "--projector/--no-projector"),
) -> None:
    """Serve the read API, the live dashboard (/) and /metrics; by default runs the projector too."""
    from projections.api import serve

    serve(config.load(), db, host, port, with_projector)


@app.command()
def demo() -> None:
    """Run DESIGN.md §8's worked example through the broker and print the final balances."""
    from connectors.demo import run_demo

    raise typer.Exit(run_demo())


if __name__ == "__main__":
    app()
