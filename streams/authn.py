"""Client authentication to the engine: signed command records, the clients file, and each client's policy.

A client signs every commands record it produces with its own key: two Kafka record headers,
``ledger-client`` (its client id) and ``ledger-signature``, an HMAC-SHA256 under the client's key of the
topic, the partition, the client id and the record value (streams/seal.py's construction, another domain).
The value is the whole record, so one signature covers every command of a CommandBatch.

Workers read the clients file named by LEDGER_CLIENTS (TOML, or JSON when the name ends in .json): per
client id its key (``key``, or ``key_file`` relative to the clients file; ``old_keys`` are still accepted
during a rotation) and its policy (streams/core/policy.py: the account patterns it may ``debit``,
``credit``, ``open``, ``freeze``, ``hold``). With the file set, a record a client wrote is taken only when
its signature verifies under the key of the client it names and every command in it carries that client
id; otherwise each of its commands is rejected ``not_authenticated`` and changes nothing. Records the
engine sealed (its own follow-ups, forwarded commands) were judged where the client's record arrived and
are not judged again. Without the file the ledger runs open, as in development: any client id is taken
at its word and may do anything (the worker says so when it starts). docs/security.md has the model.

Clients: LEDGER_CLIENT_KEY (the key) or LEDGER_CLIENT_KEY_FILE, or the `key` argument of LedgerClient.
"""
from __future__ import annotations

import hmac
import json
import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from streams.config import ConfigError
from streams.core.policy import ACTIONS, ClientPolicy
from streams.seal import Headers, record_mac, single_header

log = logging.getLogger("ledger.authn")

CLIENT_HEADER = "ledger-client"
SIGNATURE_HEADER = "ledger-signature"
ENV_CLIENTS = "LEDGER_CLIENTS"
ENV_CLIENT_KEY = "LEDGER_CLIENT_KEY"
ENV_CLIENT_KEY_FILE = "LEDGER_CLIENT_KEY_FILE"
_DOMAIN = b"ledger-client-signature/v1\x00"


def signature(key: bytes, client_id: str, topic: str, partition: int, value: bytes) -> bytes:
    return record_mac(key, _DOMAIN, topic, partition, value, client_id)


class Signer:
    """A client's side: the headers that authenticate a commands record it produces."""

    def __init__(self, client_id: str, key: bytes):
        assert key, "an empty client key"
        self.client_id = client_id
        self._key = key
        self._id_header = client_id.encode()

    def headers(self, topic: str, partition: int, value: bytes) -> list[tuple[str, bytes]]:
        return [(CLIENT_HEADER, self._id_header),
                (SIGNATURE_HEADER, signature(self._key, self.client_id, topic, partition, value))]

    @classmethod
    def for_client(cls, client_id: str, key: str | bytes | None = None,
                   env: Mapping[str, str] | None = None) -> "Signer | None":
        """The signer of a client: its key given, else LEDGER_CLIENT_KEY or LEDGER_CLIENT_KEY_FILE; None
        (unsigned records, for a ledger running open) when there is none."""
        env = os.environ if env is None else env
        if key is None:
            if env.get(ENV_CLIENT_KEY):
                key = env[ENV_CLIENT_KEY]
            elif env.get(ENV_CLIENT_KEY_FILE):
                key = _read_key(Path(env[ENV_CLIENT_KEY_FILE]), ENV_CLIENT_KEY_FILE)
        if not key:
            return None
        return cls(client_id, key.encode() if isinstance(key, str) else key)


@dataclass(frozen=True, slots=True)
class Client:
    keys: tuple[bytes, ...]  # the current key first, then keys still accepted during a rotation
    policy: ClientPolicy


class Clients:
    """A worker's side: who the clients are (their keys) and what each may do (their policies)."""

    def __init__(self, clients: Mapping[str, Client], source: str = "clients"):
        self._clients = dict(clients)
        self.source = source

    def __len__(self) -> int:
        return len(self._clients)

    def authenticate(self, topic: str, partition: int, value: bytes | None, headers: Headers) -> tuple[str | None, str]:
        """(the client that signed this record, "") or (None, why it is not authenticated)."""
        claimed = single_header(headers, CLIENT_HEADER)
        tag = single_header(headers, SIGNATURE_HEADER)
        if claimed is None or tag is None or value is None:
            return None, f"unsigned: a record without one {CLIENT_HEADER} and one {SIGNATURE_HEADER} header"
        try:
            client_id = claimed.decode()
        except UnicodeDecodeError:
            return None, f"unknown_client: the {CLIENT_HEADER} header is not UTF-8"
        client = self._clients.get(client_id)
        if client is None:
            return None, f"unknown_client: {client_id[:200]!r} is not in {self.source}"
        if not any(hmac.compare_digest(tag, signature(k, client_id, topic, partition, value)) for k in client.keys):
            return None, f"bad_signature: the signature is not {client_id[:200]!r}'s for this record and partition"
        return client_id, ""

    def policy(self, client_id: str) -> ClientPolicy:
        return self._clients[client_id].policy

    @classmethod
    def from_mapping(cls, data: Mapping, base: Path = Path("."), source: str = "clients") -> "Clients":
        """From the parsed clients file: {"clients": {client_id: {key | key_file, old_keys?, debit?, ...}}}."""
        table = data.get("clients") if isinstance(data, Mapping) else None
        if not isinstance(table, Mapping) or not table:
            raise ConfigError(f"{source}: needs a [clients.<client id>] table per client")
        clients = {}
        for client_id, entry in table.items():
            where = f"{source}: client {client_id!r}"
            if not isinstance(entry, Mapping):
                raise ConfigError(f"{where} must be a table")
            unknown = set(entry) - {"key", "key_file", "old_keys", *ACTIONS}
            if unknown:
                raise ConfigError(f"{where} has unknown fields {sorted(unknown)} (known: key, key_file, "
                                  f"old_keys, {', '.join(ACTIONS)})")
            if ("key" in entry) == ("key_file" in entry):
                raise ConfigError(f"{where} needs exactly one of key, key_file")
            key = entry["key"] if "key" in entry else _read_key(base / entry["key_file"], where)
            old = entry.get("old_keys", [])
            if not isinstance(key, str) or not key or not isinstance(old, list) or \
                    not all(isinstance(k, str) and k for k in old):
                raise ConfigError(f"{where}: key and old_keys must be non-empty strings")
            patterns = {}
            for action in ACTIONS:
                value = entry.get(action, [])
                if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
                    raise ConfigError(f"{where}: {action} must be a list of account patterns")
                patterns[action] = tuple(value)
            clients[client_id] = Client((key.encode(), *(k.encode() for k in old)),
                                        ClientPolicy(client_id, **patterns))
        return cls(clients, source)

    @classmethod
    def from_file(cls, path: Path) -> "Clients":
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
            raise ConfigError(f"{ENV_CLIENTS}={path}: {exc}") from None
        return cls.from_mapping(data, path.parent, str(path))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Clients | None":
        """The clients file of LEDGER_CLIENTS; None (the ledger runs open) when it is not set."""
        env = os.environ if env is None else env
        path = env.get(ENV_CLIENTS)
        return cls.from_file(Path(path)) if path else None


def announce(clients: Clients | None) -> None:
    """Say in the worker's log, as it starts, whether clients are authenticated (and by which file)."""
    if clients is None:
        log.warning("%s is not set: the ledger runs OPEN (development mode). Any producer may write commands "
                    "under any client id and move any account's money. Set %s to a clients file "
                    "(docs/security.md) in any deployment that holds real money.", ENV_CLIENTS, ENV_CLIENTS)
    else:
        log.info("client authentication on: %d clients and their policies from %s", len(clients), clients.source)


def _read_key(path: Path, where: str) -> str:
    try:
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the key file {path}: {exc}") from None
    if not key:
        raise ConfigError(f"{where}: the key file {path} is empty")
    return key
