"""`ledger import`'s parsing and staged check, broker-free: dated lines in time order, and the pure core's
prediction of each line on an empty ledger (the broker half is in test_wallet_ops.py)."""
from __future__ import annotations

import json

from connectors.backfill import check, parse_import

JAN_1_2020 = 1_577_836_800_000
DAY = 86_400_000


def line(at_ms: int, **fields) -> str:
    return json.dumps({**fields, "at_ms": at_ms})


def legs(*pairs: tuple[str, ...]) -> list[dict]:
    """(account, amount) or (account, amount, currency) per leg."""
    return [{"account": a, "amount": v, **({"currency": c[0]} if c else {})} for a, v, *c in pairs]


def test_each_line_keeps_its_time_and_the_check_predicts_every_decision():
    text = [
        line(JAN_1_2020, type="open", account="user:old:USD", currency="USD"),
        line(JAN_1_2020 + DAY, type="post", id="dep-1", kind="deposit",
             legs=legs(("sys:world:USD", "-100.00"), ("user:old:USD", "100.00"))),
        line(JAN_1_2020 + 2 * DAY, type="hold", id="h-1", account="user:old:USD", amount="30.00"),
        line(JAN_1_2020 + 3 * DAY, type="post", id="pay-1", legs=legs(("user:old:USD", "-80.00"),
                                                                       ("sys:world:USD", "80.00"))),
        line(JAN_1_2020 + 3 * DAY, type="post", id="pay-2", occurred_at_ms=JAN_1_2020,
             legs=legs(("user:old:USD", "-70.00"), ("sys:world:USD", "70.00"))),
        "",
        line(JAN_1_2020 + 4 * DAY, type="post", id="ghost", legs=legs(("user:nobody:USD", "-1.00"),
                                                                       ("sys:world:USD", "1.00"))),
        line(JAN_1_2020, type="release", hold="h-1", account="user:old:USD"),            # out of order
        json.dumps({"type": "open", "account": "user:x:USD", "currency": "USD"}),        # no at_ms
    ]
    lines, bad = parse_import(text, "importer")
    assert bad == [(8, f"at_ms {JAN_1_2020} is before the previous line's {JAN_1_2020 + 4 * DAY}: an import is "
                       f"in time order"),
                   (9, "'at_ms' (the original time, ms since the epoch) is required on every line")]
    assert [(x.number, x.at_ms) for x in lines] == [(1, JAN_1_2020), (2, JAN_1_2020 + DAY), (3, JAN_1_2020 + 2 * DAY),
                                                    (4, JAN_1_2020 + 3 * DAY), (5, JAN_1_2020 + 3 * DAY),
                                                    (7, JAN_1_2020 + 4 * DAY)]
    deposit = lines[1].record["body"][1]
    assert deposit["occurred_at_ms"] == JAN_1_2020 + DAY  # business time defaults to the line's time
    assert lines[4].record["body"][1]["occurred_at_ms"] == JAN_1_2020  # unless the line says otherwise
    assert [(p.number, p.command_id, p.outcome) for p in check(lines)] == [
        (1, lines[0].command_id, "accepted"), (2, "dep-1", "accepted"), (3, "hold:h-1", "accepted"),
        (4, "pay-1", "insufficient_funds"),   # 100 posted, 30 held: 70 available
        (5, "pay-2", "accepted"), (7, "ghost", "unknown_account")]


def test_decimal_amounts_of_a_runtime_currency_are_parsed_with_the_declared_scale():
    """--currency XAU:3: "1.250" XAU is 1,250 minor units, a fourth non-zero decimal is refused, never rounded;
    without the declaration the code is unknown. (That every partition confirms the scale is in
    test_wallet_ops.py, through the broker.)"""
    import pytest

    from connectors.currencies import CurrencyDeclarationError, parse_declarations, registry_with
    from connectors.jsonl import parse_file

    declared = parse_declarations(["XAU:3", "XAU:3"])
    assert declared == {"XAU": 3}
    registry = registry_with(declared)
    text = [json.dumps({"type": "post", "id": "g1", "legs": legs(("sys:world:XAU", "-1.250"),
                                                                 ("user:a:XAU", "1.25"))}),
            json.dumps({"type": "post", "id": "g2", "legs": legs(("sys:world:XAU", "-1.2345"),
                                                                 ("user:a:XAU", "1.2345"))}),
            json.dumps({"type": "hold", "id": "h1", "account": "user:a:XAU", "amount": "0.5"})]
    lines, bad = parse_import([line(JAN_1_2020 + i, **json.loads(t)) for i, t in enumerate(text)], "importer",
                              registry)
    assert [leg["amount"] for leg in lines[0].record["body"][1]["legs"]] == ["-1250", "1250"]
    assert lines[1].record["body"][1]["amount"] == "500"
    assert bad == [(2, "leg 0 amount '-1.2345': precision_exceeded (XAU has 3 decimals)")]
    good, bad = parse_file(text)  # without the declaration
    assert not good and [error for _, error in bad] == ["unknown currency 'XAU' for leg 0 amount"] * 2 + [
        "unknown currency 'XAU' for amount"]
    for wrong in (["XAU"], ["XAU:x"], ["XA:U:3"], ["XAU:37"], ["USD:3"], ["XAU:3", "XAU:2"]):
        with pytest.raises(CurrencyDeclarationError):
            parse_declarations(wrong)


def test_a_return_line_is_a_transaction_naming_its_payment():
    lines, bad = parse_import([line(JAN_1_2020, type="return", id="cb-1", transaction="dep-1", payee="user:a:USD",
                                    payer="sys:world:USD", amount="4.00", kind="chargeback")], "importer")
    assert not bad
    body = lines[0].record["body"][1]
    assert (body["kind"], body["links"], body["metadata"]) == ("chargeback", ["dep-1"], {"ledger.returns": "dep-1"})
    assert [(leg["account_id"], leg["amount"]) for leg in body["legs"]] == [("user:a:USD", "-400"),
                                                                             ("sys:world:USD", "400")]
    # a payment made in steps: the return names its last step and links to the others
    lines, bad = parse_import([line(JAN_1_2020, type="return", id="cb-2", transaction="settle-1", payee="user:a:USD",
                                    payer="sys:custody:USD", amount="1.00", steps=["init-1", "front-1"]),
                               line(JAN_1_2020 + 1, type="return", id="cb-3", transaction="settle-1",
                                    payee="user:a:USD", payer="sys:custody:USD", amount="1.00", steps="init-1")],
                              "importer")
    assert lines[0].record["body"][1]["links"] == ["settle-1", "init-1", "front-1"]
    assert bad == [(2, "'steps' must be a list of transaction ids")]


def test_the_staged_check_predicts_a_chargeback_of_a_deposit_made_in_steps():
    """An imported card deposit of 50.00, 20.00 fronted, settled, all spent: its chargeback names the
    settlement and lists the other steps; one without them is predicted not_returnable, and more than the
    deposit exceeds_unreturned."""
    at = iter(range(JAN_1_2020, JAN_1_2020 + 100))
    pending = "user:cy:pending.USD"  # its id does not end in its currency: the legs state it
    cb = {"type": "return", "transaction": "settle-1", "payee": "user:cy:USD", "payer": "sys:custody:USD"}
    text = [line(next(at), type="open", account="user:cy:USD", currency="USD"),
            line(next(at), type="open", account="user:cy:pending.USD", currency="USD"),
            line(next(at), type="post", id="init-1", legs=legs(("sys:in_transit:USD", "-50.00"),
                                                                (pending, "50.00", "USD"))),
            line(next(at), type="post", id="front-1", legs=legs((pending, "-20.00", "USD"),
                                                                 ("user:cy:USD", "20.00"))),
            line(next(at), type="post", id="settle-1", links=["init-1"],
                 legs=legs(("sys:custody:USD", "-50.00"), ("sys:in_transit:USD", "50.00"),
                           (pending, "-30.00", "USD"), ("user:cy:USD", "30.00"))),
            line(next(at), type="post", id="spend-1", legs=legs(("user:cy:USD", "-50.00"),
                                                                 ("sys:world:USD", "50.00"))),
            line(next(at), **cb, id="cb-0", amount="50.00", kind="chargeback"),
            line(next(at), **cb, id="cb-1", amount="50.01", kind="chargeback", steps=["init-1", "front-1"]),
            line(next(at), **cb, id="cb-2", amount="50.00", kind="chargeback", steps=["init-1", "front-1"])]
    lines, bad = parse_import(text, "importer")
    assert not bad
    assert [(p.command_id, p.outcome) for p in check(lines)][2:] == [
        ("init-1", "accepted"), ("front-1", "accepted"), ("settle-1", "accepted"), ("spend-1", "accepted"),
        ("cb-0", "not_returnable"), ("cb-1", "exceeds_unreturned"), ("cb-2", "accepted")]
