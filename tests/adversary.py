"""A seeded fuzzer of the commands topic (DESIGN.md P11, §7.5): hostile records mixed with valid traffic.

Used by tests/engine/test_fuzz.py (a short run) and `make fuzz` (scripts/fuzz.py, a longer one). It writes
with a plain confluent-kafka producer, as an attacker would:

- ``random_bytes``: random bytes, some starting with the Avro marker or a real schema fingerprint;
- ``truncated`` / ``mutated``: valid commands cut short, or with bytes flipped, inserted or deleted;
- ``batches``: CommandBatch envelopes of valid, broken and foreign items, cut or mutated, empty, nested,
  linked ones naming a coordinator (so read as copies elsewhere), one that does not exist included;
- ``kinds``: every command and engine-step kind (Reserve, Vote, Decide included), under the engine's own
  client id against the valid users' accounts (forgeries: must all be refused) and under other client ids
  against the fuzzer's own accounts, with and without a made-up seal header;
- ``huge``: ids of 300,000 characters, 5,000 legs, 5,000 metadata entries, 10,000-digit amounts, records
  past the producer's 1 MB default (compressed, so the broker takes them);
- ``wrong_types``: hand-made Avro with union indexes out of range, negative lengths, invalid UTF-8, wrong
  messages (a balance, a result) and tombstones.

The valid traffic (client ``fuzz-valid``: opens, deposits, same- and cross-partition transfers, transfers
with debits in two partitions, holds captured in part and released) is sized so every command is accepted
in any interleaving, and is also run without the noise through real PartitionProcessors in memory: the
balances of its accounts must be the same. Noise never names a valid user's account under a client id
other than the engine's: the ledger does not authorise clients yet, so such a command would be a valid
one (docs/engine.md, Trust boundary).
"""
from __future__ import annotations

import random
import struct
from collections import Counter, deque
from dataclasses import dataclass, field

from confluent_kafka import Producer

from schemas.codec import codec
from streams import routing
from streams.config import Settings
from streams.partition import PartitionProcessor
from streams.routing import ENGINE_CLIENT
from streams.store import MemoryStore

C = codec()
VALID_CLIENT = "fuzz-valid"
KINDS = ("OpenAccount", "FreezeAccount", "UnfreezeAccount", "CloseAccount", "PostTransaction", "PlaceHold",
         "ReleaseHold", "ExpireHold", "Reserve", "Vote", "Decide")
CLASSES = ("random_bytes", "truncated", "mutated", "batches", "kinds", "huge", "wrong_types")


@dataclass
class Sent:
    """What one fuzz run wrote."""
    valid: list[tuple[int, bytes, bytes]] = field(default_factory=list)  # (partition, key, value) in send order
    valid_ids: list[str] = field(default_factory=list)
    valid_accounts: list[str] = field(default_factory=list)
    by_class: Counter = field(default_factory=Counter)  # noise records per class
    records: int = 0


def _command(command_id: str, client_id: str, kind: str, body: dict) -> bytes:
    return C.encode("command", {"command_id": command_id, "client_id": client_id, "body": (f"ledger.{kind}", body)})


def _legs(*legs: tuple[str, int], currency: str | None = None) -> list[dict]:
    return [{"account_id": a, "amount": str(x), "hold_id": None, "currency": currency} for a, x in legs]


def _tx_body(tx_id: str, legs: list[dict], **extra) -> dict:
    return {"transaction_id": tx_id, "legs": legs, "kind": "transfer", "reference": None, "links": [],
            "metadata": {}, "occurred_at_ms": None, "rate_snapshot_id": None, **extra}


def _open_body(account: str) -> dict:
    return {"account_id": account, "currency": "USD", "allow_negative": False, "overdraft_limit": "0",
            "max_balance": None, "routing_key": None}


# --- the valid traffic ------------------------------------------------------------------------------------

def valid_traffic(rng: random.Random, partitions: int, users: int, steps: int) -> Sent:
    """Commands that are all accepted in any interleaving: large deposits, small payments, own holds."""
    sent = Sent()
    accounts = [f"user:v{i}:USD" for i in range(users)]
    sent.valid_accounts = accounts

    def send(command_id: str, kind: str, body: dict, debtor: str) -> None:
        key = routing.routing_key_for(debtor)
        sent.valid.append((routing.partition_for_key(key, partitions), key.encode(),
                           _command(command_id, VALID_CLIENT, kind, body)))
        sent.valid_ids.append(command_id)

    for a in accounts:
        send(f"open:{a}", "OpenAccount", _open_body(a), a)
    for i, a in enumerate(accounts):
        send(f"dep-{i}", "PostTransaction", _tx_body(f"dep-{i}", _legs(("sys:world:USD", -1_000_000), (a, 1_000_000)),
                                                     kind="deposit"), a)
    for n in range(steps):  # each user spends at most ~steps * 300 of its 1,000,000: never short
        a, b, c = rng.sample(accounts, 3)
        roll = rng.random()
        if roll < 0.5:
            amount = rng.randint(1, 300)
            send(f"t-{n}", "PostTransaction", _tx_body(f"t-{n}", _legs((a, -amount), (b, amount), currency="USD")), a)
        elif roll < 0.7:  # debits in (usually) two partitions: reserved, then committed
            x, y = rng.randint(1, 200), rng.randint(1, 200)
            send(f"m-{n}", "PostTransaction",
                 _tx_body(f"m-{n}", _legs((a, -x), (b, -y), (c, x + y), currency="USD")), a)
        else:  # an own hold: placed, captured in part, released (one producer, one partition: in order)
            hold, amount = f"vh-{n}", rng.randint(10, 300)
            send(f"hold:{hold}", "PlaceHold", {"hold_id": hold, "account_id": a, "amount": str(amount),
                                              "expires_at_ms": None}, a)
            part = rng.randint(1, amount - 1)  # a rest to release
            send(f"cap-{n}", "PostTransaction", _tx_body(f"cap-{n}", [
                {"account_id": a, "amount": str(-part), "hold_id": hold, "currency": None},
                {"account_id": b, "amount": str(part), "hold_id": None, "currency": "USD"}]), a)
            send(f"release:{hold}", "ReleaseHold", {"hold_id": hold}, a)
    return sent


def baseline_balances(sent: Sent, partitions: int) -> dict[str, tuple[int, int]]:
    """The valid traffic alone through real PartitionProcessors (no broker): (posted, held) per account."""
    procs = {p: PartitionProcessor(p, partitions, MemoryStore()) for p in range(partitions)}
    queues: dict[int, deque] = {p: deque() for p in range(partitions)}
    for p, key, value in sent.valid:
        queues[p].append((key, value, None))
    offsets = Counter()
    at = 1_700_000_000_000
    while any(queues.values()):
        for p in range(partitions):
            if not queues[p]:
                continue
            key, value, headers = queues[p].popleft()
            proc = procs[p]
            proc.handle(offsets[p], at, key, value, headers)
            offsets[p] += 1
            outputs, _ = proc.take()
            proc.state.commit(offsets[p])
            for o in outputs:
                if o.topic == "commands":
                    queues[o.partition].append((o.key, o.value, proc.sealed_headers(o.partition, o.value)))
    balances = {}
    for a in sent.valid_accounts:
        account = procs[routing.partition_of_account(a, partitions)].state.account(a)
        balances[a] = (account.posted, account.held)
    return balances


# --- the noise --------------------------------------------------------------------------------------------

def _zz(n: int) -> bytes:
    """Avro long: zigzag varint."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _avro_str(raw: bytes) -> bytes:
    return _zz(len(raw)) + raw


class Noise:
    def __init__(self, rng: random.Random, partitions: int, valid_accounts: list[str]):
        self.rng = rng
        self.partitions = partitions
        self.victims = valid_accounts
        self.mine = [f"user:n{i}:USD" for i in range(8)]
        # Noise holds are "nh-…", the valid traffic's "vh-…": verify judges holds by id across partitions, and a
        # client may release any hold of a partition by its id (the ledger does not authorise clients yet).
        self.n = 0

    def _id(self, prefix: str = "z") -> str:
        self.n += 1
        return f"{prefix}-{self.n}"

    def _client(self) -> str:
        return self.rng.choice(["noise", "noise-2", "", "ledger ", "LEDGER", "x" * 40])

    def setup(self) -> list[bytes]:
        """The fuzzer's own accounts, funded, so that some noise is accepted and exercises those paths."""
        out = [_command(f"open:{a}", "noise", "OpenAccount", _open_body(a)) for a in self.mine]
        out += [_command(f"ndep-{i}", "noise", "PostTransaction",
                         _tx_body(f"ndep-{i}", _legs(("sys:world:USD", -10**9), (a, 10**9)), kind="deposit"))
                for i, a in enumerate(self.mine)]
        return out

    def good(self) -> bytes:
        """A well-formed command on the fuzzer's own accounts (material for truncation and mutation)."""
        rng, a, b = self.rng, *self.rng.sample(self.mine, 2)
        choice = rng.randrange(4)
        if choice == 0:
            return _command(self._id(), "noise", "PostTransaction",
                            _tx_body(self._id("tx"), _legs((a, -rng.randint(1, 99)), (b, rng.randint(1, 99)))))
        if choice == 1:
            return _command(self._id(), "noise", "PlaceHold", {"hold_id": self._id("nh"), "account_id": a,
                                                               "amount": str(rng.randint(1, 99)),
                                                               "expires_at_ms": rng.choice([None, 1, 2**62])})
        if choice == 2:
            return _command(self._id(), "noise", "OpenAccount", _open_body(f"user:n{rng.randint(8, 50)}:USD"))
        return _command(self._id(), "noise", rng.choice(["FreezeAccount", "UnfreezeAccount"]), {"account_id": a})

    def record(self, cls: str) -> tuple[bytes | None, bytes | None, list | None, bool]:
        """(key, value, headers, big) of one noise record of a class."""
        rng = self.rng
        key = rng.choice([b"user:n1", None, b"", bytes(rng.randrange(256) for _ in range(rng.randint(1, 50)))])
        headers = None
        if cls == "random_bytes":
            body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 400)))
            head = rng.choice([b"", b"\xc3\x01", C.header("command"), C.header("command_batch"), C.header("state")])
            return key, head + body, headers, False
        if cls == "truncated":
            value = self.good()
            return key, value[:rng.randint(0, len(value) - 1)], headers, False
        if cls == "mutated":
            value = bytearray(self.good())
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(2, len(value))  # keep the marker: mutations reach the decoder
                op = rng.randrange(3)
                if op == 0:
                    value[at] = rng.randrange(256)
                elif op == 1:
                    value.insert(at, rng.randrange(256))
                elif len(value) > 11:
                    del value[at]
            return key, bytes(value), headers, False
        if cls == "batches":
            return key, self._batch(), headers, False
        if cls == "kinds":
            return self._kind()
        if cls == "huge":
            return self._huge()
        return key, self._wrong_type(), headers, False

    def _batch(self) -> bytes:
        rng = self.rng
        items = []
        for _ in range(rng.randint(0, 8)):
            roll = rng.randrange(5)
            if roll == 0:
                items.append(self.good())
            elif roll == 1:
                items.append(self.good()[:rng.randint(0, 30)])
            elif roll == 2:
                items.append(C.encode("command_batch", {"commands": [self.good()]}))  # a batch in a batch
            elif roll == 3:
                items.append(self._forgery()[1])
            else:
                items.append(bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))))
        linked = rng.random() < 0.5
        # A linked batch may name a coordinator (a copy anywhere else), one that does not exist included.
        coordinator = rng.choice([None, None, 0, 1, self.partitions - 1, -1, 2**31 - 1]) if linked else None
        value = C.encode("command_batch", {"commands": items, "linked": linked, "coordinator": coordinator})
        if rng.random() < 0.3:
            value = value[:rng.randint(10, max(10, len(value) - 1))]
        return value

    def _forgery(self) -> tuple[bytes, bytes]:
        """An engine step or engine-client command against the valid users' accounts."""
        rng, victim, other = self.rng, rng_choice(self.rng, self.victims), rng_choice(self.rng, self.victims)
        p = routing.partition_of_account(victim, self.partitions)
        kind = rng.choice(KINDS)
        steal = _tx_body(self._id("steal"), _legs((victim, -rng.randint(1, 10**6)), ("user:mallory:USD", 5),
                                                  currency="USD"))
        bodies = {
            "OpenAccount": _open_body(victim), "FreezeAccount": {"account_id": victim},
            "UnfreezeAccount": {"account_id": victim}, "CloseAccount": {"account_id": victim},
            "PostTransaction": rng.choice([steal, _tx_body(self._id("credit"), _legs(
                ("sys:clearing:USD", -10**6), (victim, 10**6)), metadata={"ledger.return_to": other,
                                                                           "ledger.return_partition": "0"})]),
            "PlaceHold": {"hold_id": self._id("~h"), "account_id": victim, "amount": "1", "expires_at_ms": None},
            "ReleaseHold": {"hold_id": f"vh-{rng.randint(0, 500)}"},
            "ExpireHold": {"hold_id": f"vh-{rng.randint(0, 500)}"},
            "Reserve": {"transaction_client_id": VALID_CLIENT, "transaction_command_id": f"m-{rng.randint(0, 500)}",
                        "coordinator_partition": rng.choice([p, -1, 10**6]), "transaction": rng.choice(
                            [steal, {**steal, "legs": [{**leg, "amount": "abc"} for leg in steal["legs"]]}])},
            "Vote": {"transaction_client_id": VALID_CLIENT, "transaction_command_id": f"m-{rng.randint(0, 500)}",
                     "participant": rng.choice([p, -5]), "reason": rng.choice([None, "nonsense"]), "detail": "x"},
            "Decide": {"transaction_client_id": VALID_CLIENT, "transaction_command_id": f"m-{rng.randint(0, 500)}",
                       "commit": rng.random() < 0.5},
        }
        # Fresh ids: a forged step reusing a genuine step's id is refused as well, but verify would count the
        # refusal as a second decision of that id (docs/engine.md, Trust boundary).
        command_id = self._id("forged")
        return routing.routing_key_for(victim).encode(), _command(command_id, ENGINE_CLIENT, kind, bodies[kind])

    def _kind(self) -> tuple[bytes | None, bytes | None, list | None, bool]:
        rng = self.rng
        headers = rng.choice([None, [("ledger-seal", bytes(32))], [("ledger-seal", b"x")],
                              [("ledger-seal", bytes(32)), ("ledger-seal", bytes(32))]])
        if rng.random() < 0.5:
            key, value = self._forgery()
            return key, value, headers, False
        a = rng.choice(self.mine)  # any kind, from a client, on the fuzzer's own accounts
        kind = rng.choice(KINDS)
        bodies = {
            "OpenAccount": _open_body(f"user:n{rng.randint(8, 60)}:USD"), "FreezeAccount": {"account_id": a},
            "UnfreezeAccount": {"account_id": a}, "CloseAccount": {"account_id": f"user:n{rng.randint(8, 60)}:USD"},
            "PostTransaction": _tx_body(self._id("t"), _legs((a, -rng.randint(-5, 50)), (rng.choice(self.mine), 7))),
            "PlaceHold": {"hold_id": self._id("nh"), "account_id": a, "amount": rng.choice(["5", "-5", "0", "x"]),
                          "expires_at_ms": None},
            "ReleaseHold": {"hold_id": f"nh-{self.n}"}, "ExpireHold": {"hold_id": f"nh-{self.n}"},
            "Reserve": {"transaction_client_id": "noise", "transaction_command_id": "t", "coordinator_partition": 0,
                        "transaction": _tx_body("t", _legs((a, -1), (a, 1)))},
            "Vote": {"transaction_client_id": "noise", "transaction_command_id": "t", "participant": 0,
                     "reason": None, "detail": ""},
            "Decide": {"transaction_client_id": "noise", "transaction_command_id": "t", "commit": True},
        }
        return routing.routing_key_for(a).encode(), _command(self._id(), self._client(), kind, bodies[kind]), \
            headers, False

    def _huge(self) -> tuple[bytes | None, bytes | None, list | None, bool]:
        rng, a = self.rng, rng_choice(self.rng, self.mine)
        # Each under a fresh id: a rejection decided before the core is not remembered, so a second send of
        # the same invalid command is answered again (at its own log time), which verify's P4 counts twice.
        big = self._id() + "x" * rng.choice([300_000, 100_000, 33_000])
        roll = rng.randrange(8)
        if roll == 0:
            value = _command(f"open:user:n:{big}", "noise", "OpenAccount", _open_body(f"user:n:{big}"))
        elif roll == 1:
            value = _command(big, big[::-1], "FreezeAccount", {"account_id": a})
        elif roll == 2:
            value = _command(self._id(), "noise", "PostTransaction",
                             _tx_body(self._id("t"), _legs(*[(a, -1), (a, 1)] * 2_500)))
        elif roll == 3:
            value = _command(self._id(), "noise", "PostTransaction",
                             _tx_body(self._id("t"), _legs((a, -1), (a, 1)),
                                      metadata={str(i): "v" * 10 for i in range(5_000)}))
        elif roll == 4:
            value = _command(self._id(), "noise", "PlaceHold", {"hold_id": self._id("nh"), "account_id": a,
                                                                "amount": "9" * 10_000, "expires_at_ms": None})
        elif roll == 5:  # past the producer's 1 MB default: compresses to little, so the broker takes it
            value = _command(self._id(), "noise", "PostTransaction",
                             _tx_body(self._id("t"), _legs((a, -1), (a, 1)), reference="r" * 1_500_000))
            return routing.routing_key_for(a).encode(), value, None, True
        elif roll == 6:  # undecodable and past 1 MB: dead-lettered with its beginning
            value = C.header("command") + b"\x00" * 1_500_000
            return None, value, None, True
        else:
            value = C.encode("command_batch", {"commands": [_command(self._id(), "noise", "FreezeAccount",
                                                                     {"account_id": a + "y" * 300_000})
                                                            for _ in range(2)]})
        return routing.routing_key_for(a).encode(), value, None, len(value) > 900_000

    def _wrong_type(self) -> bytes | None:
        rng = self.rng
        head = C.header("command")
        roll = rng.randrange(8)
        if roll == 0:
            return None  # a tombstone
        if roll == 1:  # union branch out of range
            return head + _avro_str(b"w1") + _avro_str(b"noise") + _zz(rng.choice([11, 99, -1, 2**40]))
        if roll == 2:  # a negative string length
            return head + _zz(-5) + b"abc"
        if roll == 3:  # invalid UTF-8 in the command id
            return head + _avro_str(b"\xff\xfe\xfd") + _avro_str(b"noise") + _zz(1) + _avro_str(b"user:n1:USD")
        if roll == 4:  # a huge declared length with nothing behind it
            return head + _zz(2**60)
        if roll == 5:  # another ledger message on the commands topic
            return C.encode("balance", {"account_id": "x", "currency": "USD", "status": "open", "posted": "1",
                                        "held": "0", "available": "1", "seq": 1, "last_transaction_id": None,
                                        "updated_at_ms": 0})
        if roll == 6:  # a result
            return C.encode("result", {"command_id": "r", "client_id": "noise", "outcome": "accepted",
                                       "reason": None, "detail": "", "duplicate": False, "transaction_id": None,
                                       "at_ms": 0, "holds": []})
        # a valid FreezeAccount whose boolean / long fields are replaced by garbage bytes after the branch
        return head + _avro_str(b"w2") + _avro_str(b"noise") + _zz(4) + _avro_str(b"user:n1:USD") + b"\xff" * 10


def rng_choice(rng: random.Random, items: list[str]) -> str:
    return items[rng.randrange(len(items))]


# --- sending ------------------------------------------------------------------------------------------------

def send(settings: Settings, seed: int, noise_records: int, valid_steps: int, users: int = 12) -> Sent:
    """Write the valid traffic interleaved with `noise_records` hostile records; returns what was sent."""
    rng = random.Random(seed)
    sent = valid_traffic(rng, settings.partitions, users, valid_steps)
    noise = Noise(rng, settings.partitions, sent.valid_accounts)
    producer = Producer({**settings.kafka_config(), "compression.type": "lz4", "linger.ms": 5,
                         "message.max.bytes": 2_000_000, "enable.idempotence": True})
    topic = settings.topic("commands")
    setup = noise.setup()
    for value in setup:
        a = C.decode("command", value)["body"][1]
        account = a.get("account_id") or a["legs"][1]["account_id"]
        producer.produce(topic, value, routing.routing_key_for(account).encode(),
                         partition=routing.partition_of_account(account, settings.partitions))
    sent.records += len(setup)
    valid = deque(sent.valid)
    per_valid = noise_records / max(1, len(valid))
    budget = 0.0
    while valid or noise_records > 0:
        if valid:
            p, key, value = valid.popleft()
            producer.produce(topic, value, key, partition=p)
            sent.records += 1
            budget += per_valid
        else:
            budget = noise_records
        while budget >= 1 and noise_records > 0:
            budget -= 1
            noise_records -= 1
            cls = rng.choice(CLASSES)
            key, value, headers, _ = noise.record(cls)
            producer.produce(topic, value, key, partition=rng.randrange(settings.partitions), headers=headers)
            sent.by_class[cls] += 1
            sent.records += 1
        producer.poll(0)
    remaining = producer.flush(60)
    assert remaining == 0, f"{remaining} records not delivered"
    return sent


# --- judging ------------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    results: int
    dead_letters: int
    valid_answered: int
    valid_rejected: list[str]
    unprocessable: list[str]  # rejections from the worker's safety net: an input it did not expect
    forged_accepted: list[str]
    balances_differ: dict[str, tuple]
    report: object  # projections.verify.Report

    @property
    def ok(self) -> bool:
        return (self.report.ok and not self.valid_rejected and not self.unprocessable and not self.forged_accepted
                and not self.balances_differ)


def judge(settings: Settings, sent: Sent) -> Verdict:
    """Read what the ledger published once quiescent, and judge it."""
    from projections.topics import latest_per_account, read_topic
    from projections.verify import verify

    results = list(read_topic(settings, "results"))
    dead = list(read_topic(settings, "dlq"))
    valid: dict[str, dict] = {}
    unprocessable, forged = [], []
    for r in results:
        v = r.value
        if v["detail"].startswith("unprocessable:"):
            unprocessable.append(f"{v['client_id'][:40]}/{v['command_id'][:60]}: {v['detail'][:200]}")
        if v["client_id"] == VALID_CLIENT and not v["duplicate"]:
            valid.setdefault(v["command_id"], v)
        if v["client_id"] == ENGINE_CLIENT and v["command_id"].startswith("forged-") and v["outcome"] == "accepted":
            forged.append(v["command_id"])
    rejected = [f"{c}: {valid[c]['reason']} {valid[c]['detail'][:100]}" for c in sent.valid_ids
                if c in valid and valid[c]["outcome"] != "accepted"]
    rejected += [f"{c}: no result" for c in sent.valid_ids if c not in valid]
    latest = {a: r.value for a, r in latest_per_account(read_topic(settings, "balances")).items()}
    expected = baseline_balances(sent, settings.partitions)
    differ = {}
    for account, (posted, held) in expected.items():
        got = latest.get(account)
        pair = None if got is None else (int(got["posted"]), int(got["held"]))
        if pair != (posted, held):
            differ[account] = (pair, (posted, held))
    return Verdict(len(results), len(dead), len(valid), rejected, unprocessable, forged, differ, verify(settings))
