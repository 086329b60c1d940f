"""The `ledger` command line."""
from __future__ import annotations

import os
import sys
from typing import Optional

import typer

from streams import config



class LedgerCli(typer.Typer):
    """The `ledger` command: configuration errors and an unreachable cluster end it with one line and a
    documented exit status (2: bad configuration; 69: no Kafka within LEDGER_CONNECT_TIMEOUT_S), never a
    traceback or a flood of client logs."""

    def __call__(self, *args, **kwargs):
        import logging

        from connectors.admin import KafkaNotReady

        from streams import logs

        try:
            logs.setup()  # LEDGER_LOG_FORMAT=json: every command's log lines are JSON objects
            # librdkafka's retries are noise on a terminal: KafkaNotReady says what happened.
            logging.getLogger("ledger.kafka").setLevel(os.environ.get("LEDGER_KAFKA_LOG_LEVEL", "CRITICAL"))
            return super().__call__(*args, **kwargs)
        except config.ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except KafkaNotReady as exc:
            typer.echo(f"error: {exc}", err=True)
            sys.exit(KafkaNotReady.EXIT_STATUS)


app = LedgerCli(help="A streaming double-entry ledger on Apache Kafka.", no_args_is_help=True)
topics_app = typer.Typer(help="Create, check and delete the ledger's topics.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")
show_app = typer.Typer(help="Read balances, history and holds from the read API (`ledger api`).",
                       no_args_is_help=True)
app.add_typer(show_app, name="show")
report_app = typer.Typer(help="Month-end reports from the read API (`ledger api`).", no_args_is_help=True)
app.add_typer(report_app, name="report")
currency_app = typer.Typer(help="Currencies registered at runtime.", no_args_is_help=True)
app.add_typer(currency_app, name="currency")
rates_app = typer.Typer(help="FX rate snapshots recorded in the ledger (a rates producer).", no_args_is_help=True)
app.add_typer(rates_app, name="rates")
API_URL = typer.Option("http://127.0.0.1:8080", "--api", envvar="LEDGER_API_URL", help="The read API.")
AS_JSON = typer.Option(False, "--json", help="Print the API's JSON.")
CURRENCIES = typer.Option([], "--currency", help="CODE:SCALE of a currency registered at runtime whose decimal "
                          "amounts the file uses (repeatable); every partition confirms the scale before a line "
                          "is sent, and one that knows it with another scale stops the command.")


def _declared(values: list[str]):
    """The --currency declarations and the registry the file is parsed against (exit 2 when malformed)."""
    from connectors.currencies import CurrencyDeclarationError, parse_declarations, registry_with

    try:
        declared = parse_declarations(values)
    except CurrencyDeclarationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    return declared, registry_with(declared)


def _confirm_scales(client, declared: dict[str, int], timeout_s: float) -> None:
    """Every partition confirms the declared scales before anything else is sent (exit 1 when one does not)."""
    from connectors.client import ResultTimeout
    from connectors.currencies import confirm

    try:
        refusals = confirm(client, declared, timeout_s)
    except ResultTimeout as exc:
        typer.echo(f"nothing sent: no confirmation of the declared scales within {timeout_s}s from {exc.missing}",
                   err=True)
        raise typer.Exit(3)
    for refusal in refusals:
        typer.echo(f"error: {refusal}", err=True)
    if refusals:
        typer.echo("nothing sent: the declared scale is not the registered one", err=True)
        raise typer.Exit(1)


def _get(api: str, path: str) -> dict:
    """GET from the read API; its JSON errors become a message and exit status 1."""
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    request = urllib.request.Request(api.rstrip("/") + urllib.parse.quote(path, safe="/?=&:@"))
    if os.environ.get("LEDGER_API_TOKEN"):  # the read API's token (projections/access.py)
        request.add_header("Authorization", f"Bearer {os.environ['LEDGER_API_TOKEN']}")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        error = json.loads(exc.read() or b"{}").get("error", {})
        typer.echo(f"error: {error.get('code', exc.code)}: {error.get('message', exc.reason)}", err=True)
        raise typer.Exit(1)
    except urllib.error.URLError as exc:
        typer.echo(f"error: cannot reach the read API at {api} ({exc.reason}); is `ledger api` running?", err=True)
        raise typer.Exit(2)


def _show(api: str, path: str, as_json: bool) -> dict | None:
    """GET from the read API; with --json print its JSON and return None (nothing left to format)."""
    import json

    data = _get(api, path)
    if as_json:
        typer.echo(json.dumps(data))
        return None
    return data


def _kafka_settings() -> config.Settings:
    """The settings, once the cluster has answered (BrokerUnreachable otherwise, within the connect timeout)."""
    from connectors.admin import require_broker

    settings = config.load()
    require_broker(settings)
    return settings


def _money(value: dict) -> str:
    return f"{value['decimal']} {value['currency']}"


@show_app.command("balance")
def show_balance(account: str, api: str = API_URL, as_json: bool = AS_JSON) -> None:
    """An account's posted, held and available balance and its seq."""
    view = _show(api, f"/accounts/{account}", as_json)
    if view is None:
        return
    typer.echo(f"{view['account_id']} ({view['status']}, seq {view['seq']})")
    for field in ("posted", "held", "available"):
        typer.echo(f"  {field:10} {_money(view[field]):>30}")


@show_app.command("history")
def show_history(account: str, limit: int = typer.Option(20, help="Entries per page (the API caps it)."),
                 cursor: int = typer.Option(0, help="Start after this seq."),
                 api: str = API_URL, as_json: bool = AS_JSON) -> None:
    """An account's journal, oldest first, one page."""
    page = _show(api, f"/accounts/{account}/history?cursor={cursor}&limit={limit}", as_json)
    if page is None:
        return
    for e in page["entries"]:
        typer.echo(f"  #{e['seq']:<5} {e['kind']:16} {_money(e['amount']):>26} -> {_money(e['posted_after']):>26}"
                   f"  {e['transaction_id'] or e['hold_id'] or ''}")
    if page.get("next_cursor") is not None:
        typer.echo(f"  more: --cursor {page['next_cursor']}")


@show_app.command("holds")
def show_holds(account: str, api: str = API_URL, as_json: bool = AS_JSON) -> None:
    """The account's open holds."""
    holds = _show(api, f"/accounts/{account}/holds", as_json)
    if holds is None:
        return
    for h in holds["holds"]:
        typer.echo(f"  {h['hold_id']:30} {h['status']:9} remaining {_money(h['remaining'])}")


@show_app.command("in-clearing")
def show_in_clearing(older_than: float = typer.Option(0.0, "--older-than", help="Only transfers in clearing at "
                                                      "least this many seconds (stuck ones)."),
                     api: str = API_URL, as_json: bool = AS_JSON) -> None:
    """Cross-partition transfers whose money is still in clearing, oldest first; exit 1 if any is listed."""
    page = _show(api, f"/transfers/in-clearing?older_than_s={older_than:g}", as_json)
    if page is None:
        return
    for t in page["transfers"]:
        typer.echo(f"  {t['transaction_id']:40} {_money(t):>26}  {t['age_s']:10.1f} s in clearing")
    typer.echo(f"{len(page['transfers'])} transfer(s) in clearing" +
               (f" for {older_than:g} s or more" if older_than else ""))
    raise typer.Exit(1 if page["transfers"] and older_than else 0)


@show_app.command("drift")
def show_drift(api: str = API_URL, as_json: bool = AS_JSON) -> None:
    """The read API's background drift check: accounts whose balance is not the fold of their history."""
    report = _show(api, "/drift", as_json)
    if report is None:
        return
    if report.get("enabled") is False:
        typer.echo("the drift check is off in this read API")
        return
    for d in report["drifting"]:
        typer.echo(f"  {d['account_id']:40} {d['field']}: published {d['published']}, history says {d['folded']}")
    typer.echo(f"{len(report['drifting'])} drifting account(s) in the last complete pass "
               f"({report['passes']} pass(es), {report['checked']} checks)")
    raise typer.Exit(1 if report["drifting"] else 0)


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
    delete_topics(_kafka_settings())


acl_app = typer.Typer(help="The ACL model: who may read and write which topic (docs/security.md).",
                      no_args_is_help=True)
app.add_typer(acl_app, name="acl")
_ROLE_HELP = "Principal names (repeat the option or separate by commas)."
WORKERS = typer.Option(["worker"], "--worker", envvar="LEDGER_ACL_WORKERS", help=_ROLE_HELP)
PRODUCERS = typer.Option(["app-a", "app-b"], "--producer", envvar="LEDGER_ACL_PRODUCERS",
                         help="Producing principals; PRINCIPAL:CLIENT_ID[,CLIENT_ID] when it sends under other "
                              "client ids than its own name.")
READERS = typer.Option(["reader"], "--reader", envvar="LEDGER_ACL_READERS", help=_ROLE_HELP)
AUDITORS = typer.Option(["auditor"], "--auditor", envvar="LEDGER_ACL_AUDITORS", help=_ROLE_HELP)


def _roles(workers, producers, readers, auditors):
    from connectors.acl import Roles

    def split(values):  # "a,b" and repeated options alike; a producer's client ids keep their commas
        return [v for value in values for v in value.split(" ") if v]

    return Roles.parse(split(workers), split(producers), split(readers), split(auditors))


@acl_app.command("show")
def acl_show(workers: list[str] = WORKERS, producers: list[str] = PRODUCERS, readers: list[str] = READERS,
             auditors: list[str] = AUDITORS) -> None:
    """Print the grants `acl apply` would set, without a cluster."""
    from connectors.acl import model

    for grant in model(config.load(), _roles(workers, producers, readers, auditors)):
        typer.echo(str(grant))


@acl_app.command("apply")
def acl_apply(workers: list[str] = WORKERS, producers: list[str] = PRODUCERS, readers: list[str] = READERS,
              auditors: list[str] = AUDITORS,
              prune: bool = typer.Option(False, "--prune", help="Also delete ALLOW bindings on the ledger's "
                                                                 "resources that the model does not hold.")) -> None:
    """Set the ACL model on the cluster (as an admin principal) and create each producer's own results
    topic; idempotent."""
    from connectors.acl import AclsUnsupported, apply, create_client_results_topics
    from connectors.admin import admin_client

    settings = config.load()
    roles = _roles(workers, producers, readers, auditors)
    admin = admin_client(settings)
    for name in create_client_results_topics(settings, roles.clients(), admin):
        typer.echo(f"created {name}")
    try:
        applied = apply(settings, roles, admin, prune=prune)
    except AclsUnsupported as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    for grant in applied.created:
        typer.echo(f"granted  {grant}")
    for text in applied.removed:
        typer.echo(f"revoked  {text}")
    typer.echo(f"acl: {len(applied.created)} granted, {len(applied.kept)} already in place, "
               f"{len(applied.removed)} revoked")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(ctx: typer.Context) -> None:
    """Run a partition worker (extra arguments go to Faust's worker command)."""
    _kafka_settings()  # no cluster: one line and exit 69, not a worker retrying for ever
    from streams.app import app as faust_app

    sys.argv = ["ledger", "worker", "-l", "info", "--without-web", *ctx.args]
    faust_app.main()


PROGRESS = typer.Option(None, "--progress/--no-progress",
                        help="Progress on stderr (default: when stderr is a terminal).")


@app.command()
def verify(
    wait_s: float = typer.Option(0.0, "--wait", help="First wait up to this many seconds for quiescence."),
    progress: Optional[bool] = PROGRESS,
) -> None:
    """Check the oracles of DESIGN.md §2 over the topics (run it when the ledger is quiescent)."""
    from connectors.progress import steps, wanted
    from projections.verify import at_a_quiet_point, format_report, verify as run_verify

    settings = _kafka_settings()
    with steps(wanted(progress)) as bars:
        if wait_s:
            # Read as the topics stood at a quiet point (read again if a tick was decided meanwhile).
            quiet, report = at_a_quiet_point(settings, lambda: run_verify(settings, bars.counting), wait_s,
                                             on_state=lambda done, end: bars.set("commands decided", done, end))
            if not quiet:
                typer.echo(f"warning: the workers have not caught up after {wait_s}s; checked anyway", err=True)
        else:
            report = run_verify(settings, bars.counting)
    typer.echo(format_report(report))
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def loadgen(
    rate: float = typer.Option(200.0, help="Commands per second."),
    count: int = typer.Option(0, help="Commands to send; 0 = until interrupted."),
    users: int = typer.Option(200, help="Number of users (one USD account each)."),
    seed: int = typer.Option(7, help="Random seed: the same seed sends the same commands."),
    batch_ms: float = typer.Option(0.0, help="Send each window of this many ms as CommandBatch records "
                                             "(0: one record per command)."),
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
        for _ in gen.paced(count, rate, batch_ms / 1000):
            sent += 1
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
    client_id: str = typer.Option("cli", envvar="LEDGER_CLIENT_ID",
                                  help="Scopes the command ids; signs as this client with LEDGER_CLIENT_KEY."),
    timeout_s: float = typer.Option(60.0, "--timeout", help="Seconds to wait for all results."),
    as_json: bool = typer.Option(False, "--json", help="One JSON result per line instead of a summary."),
    currency: list[str] = CURRENCIES,
    linked: bool = typer.Option(False, "--linked", help="Every line takes effect or none does: one linked batch "
                                "(in one partition, or transactions across partitions). A bad line sends "
                                "nothing."),
) -> None:
    """Send the commands of a JSON Lines file and wait for their results.

    Every line is checked first; bad lines are reported with their line number and skipped, the good lines
    are still sent (with --linked, nothing is sent). A line answered as a duplicate (the file was submitted
    before) says so. A summary is always printed. Exit status: 0 when every line was valid and accepted (now or before), 1 otherwise;
    69 when Kafka cannot be reached.
    """
    from rich.progress import Progress

    from connectors.client import LedgerClient, ResultTimeout
    from connectors.jsonl import parse_file

    declared, registry = _declared(currency)
    lines = (sys.stdin if path == "-" else open(path, encoding="utf-8")).read().splitlines()
    good, bad = parse_file(lines, registry)
    for number, error in bad:
        typer.echo(f"line {number}: {error}", err=True)
    if linked and bad:
        typer.echo(f"nothing sent: {len(bad)} bad line(s), and a linked file is sent whole or not at all", err=True)
        raise typer.Exit(1)
    sent: list[tuple[int, str]] = []
    results: dict[str, dict] = {}
    try:
        client = LedgerClient(config.load(), client_id)
        try:
            _confirm_scales(client, declared, timeout_s)
            # A file is sent at once: one record per partition and 500 commands, or one linked batch.
            with client.linked() if linked else client.batch():
                for parsed in good:
                    sent.append((parsed.line, parsed.send(client)))
            client.flush()
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
    except BaseException:  # interrupted, or no broker: still say what was sent and answered
        _submit_summary(sent, results, bad, as_json)
        raise
    raise typer.Exit(_submit_summary(sent, results, bad, as_json))


def _submit_summary(sent: list[tuple[int, str]], results: dict[str, dict], bad: list, as_json: bool) -> int:
    """Print each answered line that is not a plain acceptance, and the summary; returns the exit status."""
    import json
    from collections import Counter

    outcomes = Counter()
    duplicates = 0
    for line, command_id in sent:
        result = results.get(command_id)
        if result is None:
            outcomes["no result"] += 1
            continue
        outcomes[result["reason"] or "accepted"] += 1
        duplicates += result["duplicate"]
        if as_json:
            typer.echo(json.dumps({"line": line, **result}))
        elif result["duplicate"]:
            typer.echo(f"line {line}: {command_id} duplicate: already {result['outcome']}"
                       + (f" ({result['reason']})" if result["reason"] else ""))
        elif result["outcome"] == "rejected":
            typer.echo(f"line {line}: {command_id} rejected: {result['reason']} ({result['detail']})")
    if not as_json:
        summary = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "nothing answered"
        typer.echo(f"{len(sent)} sent, {len(bad)} bad lines; {summary}"
                   + (f" ({duplicates} of them duplicates of an earlier submission)" if duplicates else ""))
    ok = not bad and outcomes.get("accepted", 0) == len(sent)
    return 0 if ok else 1


def _send_one(line: dict, client_id: str, as_json: bool, timeout_s: float = 30.0) -> None:
    """Send one command given as a JSON Lines object (same rules as `submit`) and print its result."""
    import json

    from connectors.client import LedgerClient, ResultTimeout
    from connectors.jsonl import LineError, parse_line

    try:
        parsed = parse_line(1, json.dumps(line))
    except LineError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    client = LedgerClient(config.load(), client_id)
    try:
        command_id = parsed.send(client)
        result = client.result(command_id, timeout_s)
    except ResultTimeout:
        typer.echo(f"no result within {timeout_s}s for {command_id}; sending it again is safe", err=True)
        raise typer.Exit(3)
    finally:
        client.close()
    if as_json:
        typer.echo(json.dumps(result))
    else:
        why = f" {result['reason']}: {result['detail']}" if result["reason"] else ""
        typer.echo(f"{command_id}: {result['outcome']}{why}{' (duplicate)' if result['duplicate'] else ''}")
    raise typer.Exit(0 if result["outcome"] == "accepted" else 1)


CLIENT_ID = typer.Option("cli", "--client-id", envvar="LEDGER_CLIENT_ID",
                          help="Scopes the command ids; signs as this client with LEDGER_CLIENT_KEY.")


@app.command("open")
def open_account(account: str, currency: str,
                 account_type: Optional[str] = typer.Option(None, "--type", help="asset, liability, equity, revenue "
                                                            "or expense (default: by its name; a customer "
                                                            "account is a liability)."),
                 client_id: str = CLIENT_ID, as_json: bool = AS_JSON) -> None:
    """Open an account, e.g. `ledger open user:42:USD USD`."""
    _send_one({"type": "open", "account": account, "currency": currency,
               **({"account_type": account_type} if account_type else {})}, client_id, as_json)


@app.command()
def post(
    transaction_id: str,
    legs: list[str] = typer.Option(..., "--leg", help="ACCOUNT=AMOUNT (major units, e.g. user:1:USD=-10.00); "
                                                      "ACCOUNT=AMOUNT@HOLD captures from a hold. Repeat."),
    kind: str = typer.Option("transfer", help="deposit, withdrawal, trade, fee, refund, ..."),
    client_id: str = CLIENT_ID,
    as_json: bool = AS_JSON,
) -> None:
    """Post a transaction from flags: `ledger post dep-1 --leg sys:world:USD=-10 --leg user:1:USD=10`."""
    parsed = []
    for text in legs:
        account, sep, amount = text.rpartition("=")
        if not sep or not account:
            typer.echo(f"error: --leg {text!r} is not ACCOUNT=AMOUNT", err=True)
            raise typer.Exit(2)
        amount, _, hold = amount.partition("@")
        parsed.append({"account": account, "amount": amount, **({"hold": hold} if hold else {})})
    _send_one({"type": "post", "id": transaction_id, "kind": kind, "legs": parsed}, client_id, as_json)


@app.command()
def hold(hold_id: str, account: str, amount: str, expires_at_ms: Optional[int] = None,
         client_id: str = CLIENT_ID, as_json: bool = AS_JSON) -> None:
    """Place a hold: `ledger hold order-7 user:1:USD 2.50`."""
    _send_one({"type": "hold", "id": hold_id, "account": account, "amount": amount, "expires_at_ms": expires_at_ms},
              client_id, as_json)


@app.command()
def release(hold_id: str, account: str, client_id: str = CLIENT_ID, as_json: bool = AS_JSON) -> None:
    """Release what remains of a hold: `ledger release order-7 user:1:USD`."""
    _send_one({"type": "release", "hold": hold_id, "account": account}, client_id, as_json)


@app.command("holds")
def holds(open_longer_than: str = typer.Option("7d", "--open-longer-than",
                                               help="Placed at least this long ago: 90s, 30m, 12h, 7d."),
          release_hold: Optional[str] = typer.Option(None, "--release", help="Release this listed hold."),
          client_id: str = CLIENT_ID, as_json: bool = AS_JSON) -> None:
    """Open holds placed longer ago than a duration, oldest first (a lost close or failure report strands one);
    `--release HOLD` ends a listed one. Exit 1 when any is listed (connectors/holds.py)."""
    import json
    import time

    from connectors.holds import duration_ms, open_holds
    from projections.topics import read_topic

    try:
        older_than_ms = duration_ms(open_longer_than)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--open-longer-than") from None
    settings = _kafka_settings()
    found = open_holds((r.value for r in read_topic(settings, "results") if r.value is not None),
                       int(time.time() * 1000), older_than_ms)
    if release_hold is not None:
        chosen = [h for h in found if h.hold_id == release_hold]
        if not chosen:
            typer.echo(f"error: {release_hold} is not an open hold placed {open_longer_than} ago or more", err=True)
            raise typer.Exit(2)
        _send_one({"type": "release", "hold": release_hold, "account": chosen[0].account_id}, client_id, as_json)
    now_ms = int(time.time() * 1000)
    if as_json:
        typer.echo(json.dumps([{"hold_id": h.hold_id, "account_id": h.account_id, "amount": str(h.amount),
                                "remaining": str(h.remaining), "placed_at_ms": h.placed_at_ms,
                                "expires_at_ms": h.expires_at_ms} for h in found]))
    else:
        for h in found:
            expiry = "no expiry" if h.expires_at_ms is None else f"expires at {h.expires_at_ms}"
            typer.echo(f"  {h.hold_id:30} {h.account_id:28} remaining {h.remaining:>20}  "
                       f"open {h.age_ms(now_ms) / 3_600_000:8.1f} h  {expiry}")
        typer.echo(f"{len(found)} hold(s) open for {open_longer_than} or more")
    raise typer.Exit(1 if found else 0)


@app.command()
def reconcile(
    statement: str = typer.Argument(..., help="The statement: CSV with a header (reference or id, amount), or "
                                              "JSON (an array or one object per line); - for stdin."),
    account: str = typer.Option(..., "--account", help="The ledger account it reports on, e.g. sys:custody:USDT."),
    since: Optional[str] = typer.Option(None, "--since", help="Only ledger entries from this business date on."),
    until: Optional[str] = typer.Option(None, "--until", help="Only ledger entries up to this business date."),
    metrics_file: Optional[str] = typer.Option(None, "--metrics-file", help="Also write the result in Prometheus "
                                                                            "text format (textfile collector)."),
    api: str = API_URL, as_json: bool = AS_JSON,
) -> None:
    """Match a statement against an account's journal by reference: matched, amount mismatches, missing from
    the ledger, missing from the statement. Exit 0 when everything matches, 1 otherwise, 2 on bad input."""
    import json
    import sys
    import time

    from projections import reconcile as rec
    from projections.metrics import money
    from projections.reports import BadAsOf, parse_as_of, parse_since
    from streams.core import DEFAULT_CURRENCIES, AccountType

    view = _get(api, f"/accounts/{account}")
    currency = DEFAULT_CURRENCIES.get(view["currency"])
    if currency is None:
        typer.echo(f"error: {view['currency']} has no scale the CLI knows (a currency registered at runtime)", err=True)
        raise typer.Exit(2)
    try:
        text = sys.stdin.read() if statement == "-" else open(statement, encoding="utf-8").read()
        lines = rec.parse_statement(text, currency)
        window = (None if since is None else parse_since(since), None if until is None else parse_as_of(until))
    except (OSError, rec.StatementError, BadAsOf) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    entries = []
    for shard in [s["account_id"] for s in view.get("shard_views", ())] or [account]:
        cursor = None
        while True:
            page = _get(api, f"/accounts/{shard}/history?limit=1000" + (f"&cursor={cursor}" if cursor else ""))
            entries += page["entries"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
    items = rec.ledger_items(entries, AccountType(view["account_type"]))
    result = rec.reconcile(account, currency.code, lines, items, *window)
    if metrics_file:
        with open(metrics_file, "w", encoding="utf-8") as out:
            out.write(rec.metrics_text(result, int(time.time() * 1000)))
    if as_json:
        typer.echo(json.dumps(rec.as_json(result, money)))
    else:
        def shown(v):
            return "-" if v is None else money(v, currency.code)["decimal"]

        for d in result.items:
            where = f"lines {','.join(map(str, d.lines))}" if d.lines else ""
            typer.echo(f"{d.kind:<24}{d.reference:<40}{'statement ' + shown(d.statement):>28}"
                       f"{'ledger ' + shown(d.ledger):>28}  {where} {' '.join(d.transactions)}".rstrip())
        counts = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in result.counts.items())
        typer.echo(f"{account} ({view['account_type']}, {currency.code}): {counts}")
    raise typer.Exit(0 if result.reconciled else 1)


@app.command("import")
def import_file(
    path: str = typer.Argument(..., help="JSON Lines as for submit, each line with its original time at_ms; - for "
                                         "stdin."),
    check_only: bool = typer.Option(False, "--check", help="Only the staged check: predict every line, send nothing."),
    force: bool = typer.Option(False, "--force", help="Send even when the check predicts rejections."),
    client_id: str = CLIENT_ID,
    timeout_s: float = typer.Option(120.0, "--timeout", help="Seconds to wait for all results."),
    currency: list[str] = CURRENCIES,
) -> None:
    """Backfill history with its original timestamps: check the whole file first (the pure core on an empty
    ledger predicts each line), then send each command dated at_ms. Exit 0 when every line is accepted."""
    import sys
    from collections import Counter

    from connectors.backfill import check, parse_import

    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    declared, registry = _declared(currency)
    lines, bad = parse_import(text.splitlines(), client_id, registry)
    for number, error in bad:
        typer.echo(f"line {number}: {error}", err=True)
    predicted = check(lines, registry)
    refused = [p for p in predicted if p.outcome != "accepted"]
    for p in refused:
        typer.echo(f"line {p.number}: {p.command_id} would be rejected {p.outcome}", err=True)
    typer.echo(f"check: {len(lines)} lines, {len(bad)} bad, {len(refused)} predicted rejections")
    if check_only or bad or (refused and not force):
        if not check_only:
            typer.echo("nothing sent (fix the file, or --force to send anyway)", err=True)
        raise typer.Exit(0 if check_only and not bad and not refused else 1)
    from connectors.client import LedgerClient, ResultTimeout

    client = LedgerClient(config.load(), client_id)
    try:
        _confirm_scales(client, declared, timeout_s)
        for line in lines:
            client.send_dated(line.record, line.routing_account, line.at_ms)
        results = client.wait([line.command_id for line in lines], timeout_s)
    except ResultTimeout as exc:
        typer.echo(f"no result within {timeout_s}s for {len(exc.missing)} commands; importing again is safe", err=True)
        raise typer.Exit(3)
    finally:
        client.close()
    outcomes = Counter(r["outcome"] if r["outcome"] == "accepted" else r["reason"] for r in results.values())
    typer.echo("imported: " + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())))
    raise typer.Exit(0 if outcomes.get("accepted", 0) == len(lines) else 1)


@rates_app.command("publish")
def rates_publish(
    snapshot_id: str = typer.Argument(..., help="The snapshot's id, named by conversions (rate_snapshot_id)."),
    base: str = typer.Argument(..., help="Currency converted from, e.g. USD."),
    quote: str = typer.Argument(..., help="Currency converted to, e.g. EUR."),
    rate: str = typer.Argument(..., help="Units of quote per unit of base, an exact decimal, e.g. 0.925."),
    valid_for_s: int = typer.Option(60, "--valid-for", help="Seconds from now after which it is stale."),
    client_id: str = CLIENT_ID,
    timeout_s: float = typer.Option(60.0, "--timeout", help="Seconds to wait for every partition."),
) -> None:
    """Record a rate snapshot in every partition; exit 0 once each has it (accepted or rate_exists)."""
    import time

    valid_until_ms = int(time.time() * 1000) + valid_for_s * 1000
    ids, refused = _to_every_partition(
        client_id, timeout_s, "rate_exists",
        lambda client: client.record_rate(snapshot_id, base, quote, rate, valid_until_ms))
    typer.echo(f"{snapshot_id} {base}/{quote} {rate}: recorded in {len(ids) - refused} of {len(ids)} partitions")
    raise typer.Exit(1 if refused else 0)


def _to_every_partition(client_id: str, timeout_s: float, already: str, send) -> tuple[list[str], int]:
    """Send a command that goes once to every partition (send(client) -> its ids), wait for each, print every
    refusal but `already` (the partition knew it: the same command sent before); (ids, refusals)."""
    from connectors.client import LedgerClient, ResultTimeout

    client = LedgerClient(config.load(), client_id)
    try:
        ids = send(client)
        results = client.wait(ids, timeout_s)
    except ResultTimeout as exc:
        typer.echo(f"no result within {timeout_s}s for {exc.missing}; sending it again is safe", err=True)
        raise typer.Exit(3)
    finally:
        client.close()
    refused = {i: f"{r['reason']}: {r['detail']}" for i, r in results.items()
               if r["outcome"] != "accepted" and r["reason"] != already}
    for command_id, why in refused.items():
        typer.echo(f"{command_id}: rejected {why}", err=True)
    return ids, len(refused)


@currency_app.command("register")
def currency_register(
    code: str = typer.Argument(..., help="The code, e.g. XAU (1-16 of A-Z a-z 0-9 _ . -)."),
    scale: int = typer.Argument(..., help="Decimals of its minor unit, e.g. 3 (0..36)."),
    client_id: str = CLIENT_ID,
    timeout_s: float = typer.Option(60.0, "--timeout", help="Seconds to wait for every partition."),
) -> None:
    """Register a currency in every partition (one command per partition); exit 0 once each knows it."""
    ids, refused = _to_every_partition(client_id, timeout_s, "currency_exists",
                                       lambda client: client.register_currency(code, scale))
    typer.echo(f"{code} (scale {scale}): known to {len(ids) - refused} of {len(ids)} partitions")
    raise typer.Exit(1 if refused else 0)


@report_app.command("trial-balance")
def report_trial_balance(
    as_of: Optional[str] = typer.Option(None, "--as-of", help="YYYY-MM-DD (the whole day, UTC), an ISO 8601 date "
                                                              "and time, or ms since the epoch; default: now."),
    api: str = API_URL, as_json: bool = AS_JSON,
) -> None:
    """Every account's balance by currency and account type, debits against credits; exit 1 if they differ."""
    path = "/reports/trial-balance" + (f"?as_of={as_of}" if as_of else "")
    data = _show(api, path, as_json)
    if data is None:
        return
    typer.echo(f"trial balance as of {as_of or 'now'}")
    for c in data["currencies"]:
        typer.echo(f"\n{c['currency']:<8}{'type':<11}{'debit':>24}{'credit':>24}")
        for a in c["accounts"]:
            typer.echo(f"  {a['account_id']:<40}{a['account_type']:<11}"
                       f"{_money(a['debit']):>24}{_money(a['credit']):>24}")
        for t in c["types"]:
            typer.echo(f"  {'total ' + t['account_type']:<40}{t['normal_balance'] + '-normal':<11}"
                       f"{_money(t['debit']):>24}{_money(t['credit']):>24}  balance {_money(t['balance'])}")
        typer.echo(f"  {'total':<51}{_money(c['debit']):>24}{_money(c['credit']):>24}  "
                   f"{'balanced' if c['balanced'] else 'NOT BALANCED'}")
    raise typer.Exit(0 if data["balanced"] else 1)


@app.command()
def reverse(
    transaction_id: str = typer.Argument(..., help="The transaction to undo (posted by this client)."),
    account: str = typer.Option(..., "--account", help="The account the original was routed by: its debited "
                                                       "customer account, or the credited one of a deposit."),
    reversal_id: Optional[str] = typer.Option(None, "--id", help="The reversing transaction's id "
                                                                 "(default reversal:TXID)."),
    client_id: str = CLIENT_ID,
    as_json: bool = AS_JSON,
) -> None:
    """Reverse a transaction: `ledger reverse dep-1 --account user:1:USD` posts its legs mirrored, once."""
    _send_one({"type": "reverse", "transaction": transaction_id, "account": account,
               **({"id": reversal_id} if reversal_id else {})}, client_id, as_json)


@app.command()
def tail(
    as_json: bool = typer.Option(False, "--json", help="Print each result as JSON."),
    from_start: bool = typer.Option(False, "--from-start", help="Start at the beginning of the results topic."),
) -> None:
    """Print results as they are published (Ctrl-C to stop)."""
    import json
    import signal
    import threading
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    from connectors.admin import require_broker
    from schemas.codec import DecodeError, codec

    settings = config.load()
    consumer = Consumer({**settings.kafka_config(), "group.id": f"tail-{uuid.uuid4()}", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    require_broker(settings, consumer)
    start = OFFSET_BEGINNING if from_start else OFFSET_END
    consumer.assign([TopicPartition(settings.topic("results"), p, start) for p in range(settings.partitions)])
    c = codec()
    # Ctrl-C (or a TERM) ends the loop between two polls: raised inside librdkafka's poll, KeyboardInterrupt
    # could leave close() waiting for good.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.is_set():
            for msg in consumer.consume(500, timeout=0.2):
                if msg.error():
                    continue
                try:
                    r = c.decode("result", msg.value())
                except DecodeError as exc:
                    typer.echo(f"skipped an unreadable record at {msg.partition()}/{msg.offset()}: {exc}", err=True)
                    continue
                if as_json:
                    typer.echo(json.dumps(r))
                else:
                    outcome = r["outcome"] + (f" {r['reason']}: {r['detail']}" if r["reason"] else "")
                    dup = " (duplicate)" if r["duplicate"] else ""
                    typer.echo(f"{r['client_id']}/{r['command_id']}: {outcome}{dup}")
    finally:
        consumer.close()


READ_DB = typer.Option(".state/read.db", "--db", envvar="LEDGER_READ_DB",
                       help="Read store: a SQLite path, or a postgresql:// URL (?schema=NAME, default public).")


@app.command()
def projector(db: str = READ_DB) -> None:
    """Project balances, history and results into the read store until interrupted."""
    from projections.projector import main

    raise typer.Exit(main(_kafka_settings(), db))


@app.command()
def replay(
    into: Optional[str] = typer.Option(None, help="Fresh store to build, a path or a postgresql:// URL (default: a "
                                                  "temp file; against a PostgreSQL store, a new schema there)."),
    against: Optional[str] = typer.Option(None, help="Live store to compare with; exit 1 on mismatch."),
    from_offsets: Optional[str] = typer.Option(None, help="e.g. history:0=120,results:*=0"),
    from_time: Optional[str] = typer.Option(None, help="ISO 8601 or epoch ms"),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Rebuild the read projection from the topics and compare its hash with a live store."""
    from projections.replay import run_cli

    raise typer.Exit(run_cli(_kafka_settings(), into, against, from_offsets, from_time, progress))


@app.command("rebuild-balances")
def rebuild_balances(
    into_topic: Optional[str] = typer.Option(None, help="Also write the rebuilt views to this new topic."),
    progress: Optional[bool] = PROGRESS,
) -> None:
    """Fold the history topic into balance views and compare them byte for byte with the balances topic."""
    from connectors.progress import steps, wanted
    from projections.rebuild import rebuild_balances as rebuild

    settings = _kafka_settings()
    with steps(wanted(progress)) as bars:
        report = rebuild(settings, into_topic, bars.counting)
    typer.echo(f"{report.accounts} accounts from {report.history_records} history records")
    if report.unreadable:
        typer.echo(f"skipped {report.unreadable} unreadable record(s) on the history and balances topics", err=True)
    typer.echo(f"live balances hash   {report.live_hash}")
    typer.echo(f"rebuilt from history {report.rebuilt_hash}")
    if report.ok:
        typer.echo("identical" + (f"; rebuilt views written to {into_topic}" if into_topic else ""))
        return
    typer.echo(f"MISMATCH: first differing account {report.first_difference}", err=True)
    for line in report.details:
        typer.echo(f"  {line}", err=True)
    raise typer.Exit(1)


@app.command()
def api(
    db: str = READ_DB,
    host: str = typer.Option("127.0.0.1", envvar="LEDGER_API_HOST",
                             help="The address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, envvar="LEDGER_API_PORT"),
    with_projector: bool = typer.Option(True, "--projector/--no-projector"),
) -> None:
    """Serve the read API, the live dashboard (/) and /metrics; by default runs the projector too."""
    from projections.api import serve

    serve(_kafka_settings() if with_projector else config.load(), db, host, port, with_projector)


@app.command()
def demo(keep_topics: bool = typer.Option(False, "--keep-topics", help="Keep the demo's topics to inspect them "
                                                                      "(LEDGER_TOPIC_PREFIX=<prefix> ledger verify).")) -> None:
    """Run the exchange worked example through the broker and print the final balances."""
    from connectors.demo import run_demo

    raise typer.Exit(run_demo(keep_topics))


if __name__ == "__main__":
    app()
