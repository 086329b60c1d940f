"""Cross-partition order through a real broker and a real worker (DESIGN.md P10).

The producer (LedgerClient) places a trade whose buyer and seller live in different partitions in both
partitions, then at once sends the closes of both orders: every partition decides the trade before the
closes, so every trade is accepted and every close releases exactly what the trade left. And a payment sent
right after a transfer, out of the money it brings, is decided after it (tests/engine/test_credit_order.py has
the same broker-free).
"""
from __future__ import annotations

import time

from fastapi.testclient import TestClient

from connectors import rules
from connectors.client import Leg, LedgerClient
from connectors.rules import DepositConfirmed, OrderClosed, OrderPlaced, Party, TradeExecuted
from projections.api import create_app
from projections.exactly_once import assert_exactly_once
from projections.projector import catch_up
from projections.topics import latest_per_account, read_topic
from projections.verify import format_report, verify, wait_quiescent
from streams import routing
from tests.helpers.results import outcome
from tests.helpers.topics import latest_balances

PAIRS = 20


def _pairs(partitions: int) -> list[tuple[str, str]]:
    """(buyer, seller) names whose accounts live in different partitions."""
    names = [f"x{i}" for i in range(400)]
    home = {n: routing.partition_of_account(f"user:{n}:USDT", partitions) for n in names}
    pairs, used = [], set()
    for b in names:
        if b in used:
            continue
        s = next((s for s in names if s not in used and s != b and home[s] != home[b]), None)
        if s is None:
            break
        used.update((b, s))
        pairs.append((b, s))
        if len(pairs) == PAIRS:
            return pairs
    raise AssertionError("not enough users in distinct partitions")


def _send(client: LedgerClient, event) -> list[str]:
    return client.submit(rules.plan(event))


def _open_accounts(client: LedgerClient, users) -> None:
    """Each user's USDT and BTC accounts, opened as the rules open them; all must be accepted."""
    ids = []
    for user in users:
        for currency in ("USDT", "BTC"):
            routed = rules.open_user_account(user, currency)
            ids.append(client.send(routed.record["command_id"], "OpenAccount", routed.record["body"][1],
                                   routed.routing_account))
    assert all(r["outcome"] == "accepted" for r in client.wait(ids, timeout_s=120).values())


def test_a_close_sent_right_after_a_trade_never_overtakes_it(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, rules.DEFAULT_CLIENT_ID)
    pairs = _pairs(settings.partitions)
    _open_accounts(client, [user for pair in pairs for user in pair])
    ids = []
    for b, s in pairs:
        ids += _send(client, DepositConfirmed(f"dep-{b}", b, "USDT", "1000"))
        ids += _send(client, DepositConfirmed(f"dep-{s}", s, "BTC", "1"))
    assert all(r["outcome"] == "accepted" for r in client.wait(ids, timeout_s=120).values())
    ids = []
    for b, s in pairs:
        ids += _send(client, OrderPlaced(f"bid-{b}", b, "buy", "BTC", "USDT", "0.5", "1000"))
        ids += _send(client, OrderPlaced(f"ask-{s}", s, "sell", "BTC", "USDT", "0.5"))
    assert all(r["outcome"] == "accepted" for r in client.wait(ids, timeout_s=120).values())
    # Each trade, then at once the closes of both its orders, from the same producer; nothing waits between.
    trades, closes = [], []
    for b, s in pairs:
        trades += _send(client, TradeExecuted(f"t-{b}", "BTC", "USDT", "0.2", "1000", Party(b, f"bid-{b}"),
                                              Party(s, f"ask-{s}"), "seller"))
        closes.append(_send(client, OrderClosed(f"bid-{b}", b, "buy", "BTC", "USDT")))
        closes.append(_send(client, OrderClosed(f"ask-{s}", s, "sell", "BTC", "USDT")))
    results = client.wait(trades + [i for c in closes for i in c], timeout_s=180)
    refused = {i: (results[i]["reason"], results[i]["detail"]) for i in trades if results[i]["outcome"] != "accepted"}
    assert not refused, f"{len(refused)} of {len(trades)} trades refused: {list(refused.items())[:3]}"
    for close in closes:
        for i in close:
            r = results[i]
            assert r["outcome"] == "accepted", r
            released = [h for h in r["holds"] if h["status"] == "released"]
            assert released, r
            for h in released:  # 0.2 of 0.5 BTC (200 of 500 USDT) taken by the trade: the rest released
                assert int(h["captured"]) * 3 == int(h["released"]) * 2, h
    assert wait_quiescent(settings)
    report = verify(settings)
    assert report.ok, format_report(report)
    client.close()


# --- one pair at a time: a retry in flight, a close right after, payments the payee's partition refuses ---------

def _setup_pair(client: LedgerClient, b: str, s: str) -> None:
    """Both users' USDT and BTC accounts, 1000 USDT for the buyer and 1 BTC for the seller, a bid of 0.5 BTC
    at 1000 (holds 500 USDT) and an ask of 0.5 BTC (holds 0.5 BTC)."""
    _open_accounts(client, (b, s))
    ids = _send(client, DepositConfirmed(f"dep-{b}", b, "USDT", "1000"))
    ids += _send(client, DepositConfirmed(f"dep-{s}", s, "BTC", "1"))
    assert all(r["outcome"] == "accepted" for r in client.wait(ids, timeout_s=120).values())
    ids = _send(client, OrderPlaced(f"bid-{b}", b, "buy", "BTC", "USDT", "0.5", "1000"))
    ids += _send(client, OrderPlaced(f"ask-{s}", s, "sell", "BTC", "USDT", "0.5"))
    assert all(r["outcome"] == "accepted" for r in client.wait(ids, timeout_s=120).values())


def _every_answer(client: LedgerClient, expected: dict[str, int], timeout_s: float = 180) -> dict[str, list[dict]]:
    """Every result published for these command ids until each has `expected[id]` answers (decision and
    duplicates), then a little more to catch an extra decision."""
    client.flush()
    answers: dict[str, list[dict]] = {i: [] for i in expected}
    deadline = time.monotonic() + timeout_s
    while any(len(answers[i]) < n for i, n in expected.items()):
        assert time.monotonic() < deadline, {i: len(a) for i, a in answers.items()}
        for r in client.read_results(timeout_s=0.2):
            if r["command_id"] in answers:
                answers[r["command_id"]].append(r)
    for r in client.read_results(timeout_s=2.0):  # not a timing assertion: only more chances to see extras
        if r["command_id"] in answers:
            answers[r["command_id"]].append(r)
    return answers


def _one_decision(answers: list[dict]) -> dict:
    decisions = [r for r in answers if not r["duplicate"]]
    assert len(decisions) == 1, answers
    assert all((r["outcome"], r["reason"]) == (decisions[0]["outcome"], decisions[0]["reason"]) for r in answers)
    return decisions[0]


def test_a_cross_partition_trade_resent_in_flight_gets_one_decision_and_a_duplicate(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, rules.DEFAULT_CLIENT_ID)
    b, s = _pairs(settings.partitions)[0]
    _setup_pair(client, b, s)
    trade = TradeExecuted(f"t-{b}", "BTC", "USDT", "0.2", "1000", Party(b, f"bid-{b}"), Party(s, f"ask-{s}"),
                          "seller")
    ids = _send(client, trade)
    assert _send(client, trade) == ids  # the retry, sent at once: the trade is still being reserved
    answers = _every_answer(client, {i: 2 for i in ids})
    for i in ids:
        decision = _one_decision(answers[i])
        assert decision["outcome"] == "accepted", decision
        assert sorted(r["duplicate"] for r in answers[i]) == [False, True], answers[i]
    assert wait_quiescent(settings)
    report = verify(settings)
    assert report.ok, format_report(report)
    client.close()


def test_a_close_right_after_an_accepted_cross_partition_trade_releases_exactly_the_rest(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, rules.DEFAULT_CLIENT_ID)
    b, s = _pairs(settings.partitions)[1]
    _setup_pair(client, b, s)
    trade = _send(client, TradeExecuted(f"t-{b}", "BTC", "USDT", "0.2", "1000", Party(b, f"bid-{b}"),
                                        Party(s, f"ask-{s}"), "seller"))
    closes = _send(client, OrderClosed(f"bid-{b}", b, "buy", "BTC", "USDT"))
    closes += _send(client, OrderClosed(f"ask-{s}", s, "sell", "BTC", "USDT"))
    answers = _every_answer(client, {i: 1 for i in trade + closes})
    for i in trade:
        assert _one_decision(answers[i])["outcome"] == "accepted", answers[i]
    released = {}
    for i in closes:
        decision = _one_decision(answers[i])
        assert decision["outcome"] == "accepted", decision
        for h in decision["holds"]:
            if h["status"] == "released":
                released[h["hold_id"]] = (int(h["amount"]), int(h["captured"]), int(h["released"]))
    assert len(released) == 2, released
    for hold_id, (amount, captured, rest) in released.items():
        assert captured + rest == amount and captured * 5 == amount * 2, (hold_id, amount, captured, rest)
    assert wait_quiescent(settings)
    report = verify(settings)
    assert report.ok, format_report(report)
    client.close()


def test_a_payment_to_a_closed_or_unknown_account_elsewhere_is_refused_as_in_one_partition(settings, start_worker,
                                                                                           tmp_path):
    """The sender's answer is the final outcome wherever the accounts live: a payment the payee's partition
    cannot credit is rejected, once, with the reason one partition gives (account_closed, unknown_account),
    and nothing moves; a payment that can land is accepted once and every leg posts (clearing back to 0)."""
    start_worker()
    client = LedgerClient(settings, "payments")
    n = settings.partitions
    names = [f"p{i}" for i in range(400)]
    payer = f"user:{names[0]}:USD"
    others = [f"user:{x}:USD" for x in names[1:]
              if routing.partition_of_account(f"user:{x}:USD", n) != routing.partition_of_account(payer, n)]
    closed, unknown, payee = others[0], others[1], others[2]
    ids = [client.open_account(payer, "USD"), client.open_account(closed, "USD"), client.open_account(payee, "USD")]
    assert all(r["outcome"] == "accepted" for r in client.wait(ids, timeout_s=120).values())
    ids = [client.post("dep", [Leg("sys:world:USD", -10_000), Leg(payer, 10_000)]),
           client.account_command("CloseAccount", closed)]
    assert all(r["outcome"] == "accepted" for r in client.wait(ids, timeout_s=120).values())
    paid = {client.post("to-closed", [Leg(payer, -3_000), Leg(closed, 3_000)]): ("rejected", "account_closed"),
            client.post("to-unknown", [Leg(payer, -2_000), Leg(unknown, 2_000)]): ("rejected", "unknown_account"),
            client.post("to-open", [Leg(payer, -1_000), Leg(payee, 1_000)]): ("accepted", None)}
    answers = _every_answer(client, {i: 1 for i in paid})
    for i, expected in paid.items():
        decision = _one_decision(answers[i])
        assert (decision["outcome"], decision["reason"]) == expected, answers[i]
    assert wait_quiescent(settings)
    balances = {a: r.value for a, r in latest_per_account(read_topic(settings, "balances")).items()}
    assert (balances[payer]["posted"], balances[payer]["held"]) == ("9000", "0"), balances[payer]
    assert balances[payee]["posted"] == "1000" and balances[closed]["posted"] == "0" and unknown not in balances
    clearing = [b for a, b in balances.items() if a.startswith("sys:clearing:USD")]
    assert clearing and sum(int(b["posted"]) for b in clearing) == 0
    # Another client picks one of the same transaction ids for a payment of its own.
    other = LedgerClient(settings, "payments-2")
    assert other.result(other.post("to-open", [Leg(payee, -100), Leg(payer, 100)]))["outcome"] == "accepted"
    assert wait_quiescent(settings)
    # The read side tells the sender the same: posted with every leg, or rejected with the reason.
    store = str(tmp_path / "read.db")
    catch_up(settings, store)
    with TestClient(create_app(store, settings)) as api:
        delivered = api.get("/transactions/to-open", params={"client_id": "payments"}).json()
        assert delivered["status"] == "posted"
        legs = {(leg["account_id"].split("@")[0], leg["amount"]["minor"]) for leg in delivered["legs"]}
        assert {(payer, "-1000"), (payee, "1000")} <= legs
        assert sum(int(leg["amount"]["minor"]) for leg in delivered["legs"]
                   if leg["account_id"].startswith("sys:clearing:")) == 0
        for refused, reason in (("to-closed", "account_closed"), ("to-unknown", "unknown_account")):
            view = api.get(f"/transactions/{refused}", params={"client_id": "payments"}).json()
            assert (view["status"], view["results"][0]["reason"], view["legs"]) == ("rejected", reason, [])
        theirs = api.get("/transactions/to-open", params={"client_id": "payments-2"}).json()
        assert {(leg["account_id"], leg["amount"]["minor"]) for leg in theirs["legs"]
                if not leg["account_id"].startswith("sys:")} == {(payee, "-100"), (payer, "100")}
        ambiguous = api.get("/transactions/to-open")
        assert (ambiguous.status_code, ambiguous.json()["error"]["code"]) == (409, "ambiguous_transaction")
    other.close()
    report = verify(settings)
    assert report.ok, format_report(report)
    client.close()


def test_payments_chasing_transfers_through_the_broker(settings, start_worker):
    """Through the broker, as a payment app sends: a transfer from one user to another in another partition, and
    at once, without waiting, a payment out of the money it brings to a third user (most of them in yet another
    partition, so the payment is a transaction across partitions too), eight times. Every payment posts (each
    waited for its transfer where the money arrived), and the verifier finds every promise kept. Without the
    wait, 7 of 8 payments were refused insufficient_funds."""
    start_worker(extra_env={"LEDGER_TICK_S": "0"})
    client = LedgerClient(settings, "wallet")
    payer = "user:cp:USD"
    home = routing.partition_of_account(payer, settings.partitions)
    far = [f"user:cp{i}:USD" for i in range(200)
           if routing.partition_of_account(f"user:cp{i}:USD", settings.partitions) != home]
    payees, shops = far[:8], far[8:16]
    try:
        opened = [client.open_account(a, "USD") for a in [payer, *payees, *shops]]
        opened.append(client.post("cp-dep", [Leg("sys:world:USD", -800), Leg(payer, 800)], kind="deposit"))
        assert {outcome(r) for r in client.wait(opened).values()} == {"accepted"}
        sent = []
        for i, (payee, shop) in enumerate(zip(payees, shops)):
            sent.append(client.post(f"cp-in-{i}", [Leg(payer, -100), Leg(payee, 100)]))
            sent.append(client.post(f"cp-out-{i}", [Leg(payee, -70), Leg(shop, 70)]))
        answers = client.wait(sent)
        assert {i: outcome(answers[i]) for i in sent} == {i: "accepted" for i in sent}
        assert wait_quiescent(settings)
        balances = latest_balances(settings)
        assert [balances[a]["posted"] for a in [payer, *payees, *shops]] == ["0"] + ["30"] * 8 + ["70"] * 8
        report = verify(settings)
        assert report.ok, format_report(report)
    finally:
        client.close()


def test_wallets_chasing_their_incoming_money_from_two_producers_at_once(settings, start_worker):
    """Two payment apps at once, each with its own producer, neither waiting between sends: each funds a payer,
    then, 30 times, sends the payer's transfer to a wallet in another partition and at once a payment out of the
    wallet to a shop. The wallets are shared by both apps, so a wallet's payments chase credits from two
    producers, and their copies and Reserves interleave in the wallet's partition as the broker orders them.
    Every payment posts, the wallets end empty, and every promise and exactly-once check holds."""
    import threading

    start_worker(extra_env={"LEDGER_TICK_S": "0"})
    names = [f"user:cw{i}:USD" for i in range(400)]
    home = {a: routing.partition_of_account(a, settings.partitions) for a in names}
    payers = [a for a in names if home[a] == 0][:2]
    wallets = [a for a in names if home[a] not in (0,)][:6]
    shops = [a for a in names if a not in wallets and home[a] not in (0,)][:6]
    rounds = 30
    setup = LedgerClient(settings, "setup")
    try:
        opened = [setup.open_account(a, "USD") for a in [*payers, *wallets, *shops]]
        opened += [setup.post(f"cw-dep-{i}", [Leg("sys:world:USD", -rounds * 10), Leg(p, rounds * 10)],
                              kind="deposit") for i, p in enumerate(payers)]
        assert {outcome(r) for r in setup.wait(opened).values()} == {"accepted"}
    finally:
        setup.close()
    sent: dict[str, list[str]] = {}

    def app(n: int) -> None:
        client = LedgerClient(settings, f"app{n}")
        ids = sent.setdefault(f"app{n}", [])
        try:
            for i in range(rounds):
                wallet, shop = wallets[(i + n) % len(wallets)], shops[(i * 5 + n) % len(shops)]
                ids.append(client.post(f"cw{n}-in-{i}", [Leg(payers[n], -10), Leg(wallet, 10)]))
                ids.append(client.post(f"cw{n}-out-{i}", [Leg(wallet, -10), Leg(shop, 10)]))
            answers = client.wait(ids, 180)
            sent[f"app{n}:answers"] = [outcome(answers[i]) for i in ids]
        finally:
            client.close()

    threads = [threading.Thread(target=app, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    for n in range(2):
        assert sent.get(f"app{n}:answers") == ["accepted"] * (2 * rounds), sent.get(f"app{n}:answers")
    assert wait_quiescent(settings)
    balances = latest_balances(settings)
    assert [balances[w]["posted"] for w in wallets] == ["0"] * len(wallets)
    assert sum(int(balances[s]["posted"]) for s in shops) == 2 * rounds * 10
    report = verify(settings)
    assert report.ok, format_report(report)
    for n in range(2):
        assert_exactly_once(settings, f"app{n}", sent[f"app{n}"])
