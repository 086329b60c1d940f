"""The engine's seal: how a worker tells its own follow-up commands from anything a client wrote.

Every record a worker produces to the commands topic (cross-partition credits and returns, the steps of a
multi-partition transaction, forwarded commands) carries a Kafka record header ``ledger-seal``: an
HMAC-SHA256, under a key only workers hold, of the topic, the partition and the record value. A command
issued as the engine (client id ``ledger``) or a step of the two-phase protocol (Reserve, Vote, Decide) is
taken only from a record whose seal verifies; any other is rejected (``invalid_command``, detail
``engine_step_unsealed: ...``) and never executed. docs/engine.md ("Trust boundary") has the argument.

Why the partition and topic are sealed too: a genuine record copied into another partition (or another
ledger's topic on the same cluster) would otherwise be decided again there under a fresh inbox, e.g. a
credit paid twice from two clearing shards. Copied into the same partition it comes after the original,
and the inbox answers it as a duplicate.

The key: LEDGER_ENGINE_KEY (any string; at least 32 random bytes, e.g. `openssl rand -hex 32`), given to
worker processes only. LEDGER_ENGINE_KEYS_OLD (comma separated) are still accepted, never used to seal:
rotate by moving the current key there, setting a new one, and removing the old one once no record
sealed with it is left undecided. Unset, the development key below is used and the worker warns loudly:
anyone who reads this file could then forge engine steps.
"""
from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterable, Mapping

log = logging.getLogger("ledger.seal")

HEADER = "ledger-seal"
# The detail every refusal of an unsealed engine step starts with. Such a refusal is answered, not remembered
# (the id may be a real step's, still to come sealed), so it is never a decision: a copy of the record sent
# again is answered again, at its own time (projections/verify.py counts these answers apart from decisions).
UNSEALED = "engine_step_unsealed"


def is_unsealed_refusal(reason: str | None, detail: str) -> bool:
    """Whether a result is the refusal of an unsealed engine step (invalid_command, detail UNSEALED: ...)."""
    return reason == "invalid_command" and detail.startswith(UNSEALED + ":")
ENV_KEY = "LEDGER_ENGINE_KEY"
ENV_OLD_KEYS = "LEDGER_ENGINE_KEYS_OLD"
# Public, for development and tests only: a ledger running with it trusts anyone who can write its topic.
DEVELOPMENT_KEY = b"kafka-ledger development engine key: not a secret"
_DOMAIN = b"ledger-seal/v1\x00"

Headers = Iterable[tuple[str, bytes]] | Mapping[str, bytes] | None


class Seal:
    def __init__(self, key: bytes, old_keys: Iterable[bytes] = ()):
        assert key, "an empty engine key"
        self._keys = [key, *[k for k in old_keys if k]]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Seal":
        env = os.environ if env is None else env
        key = env.get(ENV_KEY, "")
        old = [k.strip().encode() for k in env.get(ENV_OLD_KEYS, "").split(",") if k.strip()]
        if not key:
            log.warning("%s is not set: using the public development key. Anyone who can write the commands "
                        "topic can forge the engine's own steps and move money. Set %s on every worker "
                        "(and only on workers) in any deployment that holds real money.", ENV_KEY, ENV_KEY)
            return cls(DEVELOPMENT_KEY, old)
        return cls(key.encode(), old)

    @staticmethod
    def _mac(key: bytes, topic: str, partition: int, value: bytes) -> bytes:
        return record_mac(key, _DOMAIN, topic, partition, value)

    def headers(self, topic: str, partition: int, value: bytes) -> list[tuple[str, bytes]]:
        """The headers a worker puts on a commands record it produces."""
        return [(HEADER, self._mac(self._keys[0], topic, partition, value))]

    def verify(self, topic: str, partition: int, value: bytes | None, headers: Headers) -> bool:
        """True when the record carries a seal made by a worker for this very topic, partition and value."""
        if value is None:
            return False
        tag = single_header(headers, HEADER)
        if tag is None:
            return False
        return any(hmac.compare_digest(tag, self._mac(k, topic, partition, value)) for k in self._keys)


# Shared with the clients' signatures (streams/authn.py): one way to bind a MAC to a record and to read it.
def record_mac(key: bytes, domain: bytes, topic: str, partition: int, value: bytes, *context: str) -> bytes:
    """HMAC-SHA256 under key of a commands record: its topic, partition and value, plus context strings
    (a client id). domain separates the uses of the construction, so no MAC made for one is valid for another."""
    parts = [domain, topic.encode(), b"\x00", str(partition).encode(), b"\x00"]
    for text in context:
        parts += [text.encode(), b"\x00"]
    parts.append(value)
    return hmac.digest(key, b"".join(parts), "sha256")


def single_header(headers: Headers, name: str) -> bytes | None:
    """The value of the one header called name; None when there is none, or several (which one would count?)."""
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    values = [v for k, v in items if k == name and isinstance(v, (bytes, bytearray))]
    return bytes(values[0]) if len(values) == 1 else None


DEVELOPMENT = Seal(DEVELOPMENT_KEY)
