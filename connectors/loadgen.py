"""A seedable, realistic command mix for demo traffic, soaks and benchmarks.

Many users with USD accounts and a skew towards hot ones; deposits from the world, transfers (same and
other partitions), holds that are captured in parts, released or left to expire, withdrawals, and a
share of invalid commands (unknown accounts, overdrafts, bad amounts) that must be rejected cleanly.
Everything follows from the seed, so a run can be repeated exactly.
"""
from __future__ import annotations

import random
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Iterator

from connectors.client import LedgerClient, Leg


@dataclass(frozen=True, slots=True)
class Mix:
    users: int = 200
    currency: str = "USD"
    deposit: float = 0.15
    transfer: float = 0.45
    hold_cycle: float = 0.15
    withdrawal: float = 0.1
    invalid: float = 0.05
    # Debits from two users (usually two partitions) into a third: reserved in both, then committed;
    # amounts are large enough that some fail, which must leave no trace (P6).
    multi_debit: float = 0.05
    # The rest: a capture/release of an earlier hold, or another transfer.


class LoadGenerator:
    """Yields callables that each send one command through a client and return its command id."""

    def __init__(self, client: LedgerClient, seed: int = 7, mix: Mix = Mix(), run_id: str = "run"):
        self.client = client
        self.rng = random.Random(seed)
        self.mix = mix
        self.run_id = run_id
        self.n = 0
        self.open_holds: list[tuple[str, str, int]] = []  # (hold_id, account, remaining guess)

    def account(self, i: int) -> str:
        return f"user:{i}:{self.mix.currency}"

    def _user(self) -> int:
        # Skewed: a few hot users get much of the traffic.
        return int(self.mix.users * (self.rng.random() ** 2))

    def _id(self, kind: str) -> str:
        self.n += 1
        return f"{self.run_id}-{kind}-{self.n}"

    def open_accounts(self) -> list[str]:
        return [self.client.open_account(self.account(i), self.mix.currency, command_id=f"{self.run_id}-open-{i}")
                for i in range(self.mix.users)]

    def next_command(self) -> str:
        r, m, c = self.rng.random(), self.mix, self.client
        cur = self.mix.currency
        if r < m.deposit:
            user, amount = self._user(), self.rng.randint(1_000, 100_000)
            return c.post(self._id("dep"), [Leg(f"sys:world:{cur}", -amount), Leg(self.account(user), amount)],
                          kind="deposit")
        r -= m.deposit
        if r < m.transfer:
            a, b = self._user(), self._user()
            if a == b:
                b = (b + 1) % m.users
            amount = self.rng.randint(1, 5_000)
            return c.post(self._id("tr"), [Leg(self.account(a), -amount), Leg(self.account(b), amount)])
        r -= m.transfer
        if r < m.hold_cycle:
            user, amount = self._user(), self.rng.randint(100, 5_000)
            hold_id = self._id("hold")
            self.open_holds.append((hold_id, self.account(user), amount))
            return c.place_hold(hold_id, self.account(user), amount)
        r -= m.hold_cycle
        if r < m.withdrawal:
            user, amount = self._user(), self.rng.randint(1, 3_000)
            return c.post(self._id("wd"), [Leg(self.account(user), -amount), Leg(f"sys:custody:{cur}", amount)],
                          kind="withdrawal")
        r -= m.withdrawal
        if r < m.invalid:
            choice = self.rng.randrange(3)
            if choice == 0:
                return c.post(self._id("bad"), [Leg(f"user:nobody:{cur}", -5), Leg(self.account(0), 5)])
            if choice == 1:
                user = self._user()
                return c.post(self._id("over"), [Leg(self.account(user), -10**15), Leg(f"sys:custody:{cur}", 10**15)])
            return c.post(self._id("unbal"), [Leg(self.account(1), -5), Leg(self.account(2), 4)])
        r -= m.invalid
        if r < m.multi_debit:
            a, b = self._user(), self._user()
            b = b if b != a else (a + 1) % m.users
            to = next(u for u in ((a + k) % m.users for k in range(2, m.users + 2)) if u not in (a, b))
            x, y = self.rng.randint(1, 20_000), self.rng.randint(1, 20_000)
            return c.post(self._id("multi"), [Leg(self.account(a), -x), Leg(self.account(b), -y),
                                              Leg(self.account(to), x + y, currency=cur)], kind="split")
        if self.open_holds:
            hold_id, account, remaining = self.open_holds.pop(self.rng.randrange(len(self.open_holds)))
            if self.rng.random() < 0.5:
                part = max(1, remaining // 2)
                if remaining - part > 0:
                    self.open_holds.append((hold_id, account, remaining - part))
                fee = part // 100
                legs = [Leg(account, -part, hold_id=hold_id), Leg(f"sys:merchant:{cur}", part - fee)]
                if fee:
                    legs.append(Leg(f"sys:fees:{cur}", fee))
                return c.post(self._id("cap"), legs, kind="capture")
            return c.release_hold(hold_id, account, command_id=self._id("rel"))
        a, b = self._user(), self._user()
        return c.post(self._id("tr"), [Leg(self.account(a), -1), Leg(self.account((b + 1) % self.mix.users), 1)])

    def commands(self, count: int) -> Iterator[str]:
        for _ in range(count):
            yield self.next_command()

    def paced(self, count: int, per_second: float, batch_window_s: float = 0.0) -> Iterator[str]:
        """Like commands(), at about per_second (count 0: without end). Sleeps between sends rather than
        bursting, so latency figures measure the ledger, not a queue in front of it.

        batch_window_s > 0: the commands of each window travel as CommandBatch records (client.batch()),
        as a gateway under load would send them; the wait in the window counts in their latency."""
        start, sent = time.monotonic(), 0
        with self.client.batch() if batch_window_s > 0 else nullcontext():
            window_ends = start + batch_window_s
            while count == 0 or sent < count:
                yield self.next_command()
                sent += 1
                now = time.monotonic()
                if batch_window_s > 0 and now >= window_ends:
                    self.client.send_pending()
                    window_ends = now + batch_window_s
                self.client.poll()
                ahead = sent / per_second - (now - start)
                if ahead > 0:
                    time.sleep(ahead)


# --- paced in the background (fault runs: load keeps coming while workers are killed) --------------------------
class Pump(threading.Thread):
    """Sends `count` commands at about `per_second` in the background, appending their ids to `sent` (which
    may already hold ids of earlier pumps). join() re-raises whatever stopped it early, so a broken generator
    cannot pass unnoticed."""

    def __init__(self, client: LedgerClient, gen: LoadGenerator, count: int, per_second: float, sent: list[str],
                 batch_window_s: float = 0.0):
        super().__init__(daemon=True)
        self.client, self.gen, self.count, self.per_second, self.sent = client, gen, count, per_second, sent
        self.batch_window_s = batch_window_s
        self.error: BaseException | None = None
        self.done = 0

    def run(self) -> None:
        try:
            for command_id in self.gen.paced(self.count, self.per_second, self.batch_window_s):
                self.sent.append(command_id)
                self.done += 1
            self.client.flush()
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread
            self.error = exc

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error
        assert self.done == self.count, f"only {self.done} of {self.count} commands sent"


def pump(client: LedgerClient, gen: LoadGenerator, count: int, per_second: float, sent: list[str],
         batch_window_s: float = 0.0) -> Pump:
    thread = Pump(client, gen, count, per_second, sent, batch_window_s)
    thread.start()
    return thread
