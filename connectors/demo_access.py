"""The demo's clients and API tokens for `make run` (scripts/run.sh): `python -m connectors.demo_access DIR`.

Writes, once (an existing folder is kept, so keys survive restarts of `make run`), into DIR (mode 700):

- clients.toml: the clients file of the worker (LEDGER_CLIENTS, streams/authn.py) with two clients:
  ``loadgen`` (the demo traffic: deposits from ``sys:world:*``, payments, holds and withdrawals of ``user:*``
  accounts, nothing else) and ``cli`` (the operator at the terminal: any account, any action);
- tokens.toml: the read API's tokens (LEDGER_API_TOKENS, projections/access.py): ``dashboard`` (every
  account and the ledger-wide views);
- loadgen.key, and demo.env: the variables a terminal sources to act as ``cli`` and read as ``dashboard``
  (LEDGER_CLIENT_ID, LEDGER_CLIENT_KEY_FILE, LEDGER_API_TOKEN).

Prints the dashboard's login URL path (``/?token=...``). Demo secrets, random per state folder: a real
deployment writes its own files (docs/security.md).
"""
from __future__ import annotations

import secrets
import sys
from pathlib import Path

from projections.access import token_hash

LOADGEN_POLICY = {"debit": ["user:*", "sys:world:*"], "credit": ["*"], "open": ["user:*"], "hold": ["user:*"]}
OPERATOR_POLICY = {action: ["*"] for action in ("debit", "credit", "open", "freeze", "hold")}


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def write(folder: Path) -> str:
    """Write the demo's access files into folder unless they exist; returns the dashboard token."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    token_file = folder / "dashboard.token"
    if token_file.exists():
        return token_file.read_text().strip()
    lines = ["# The demo's clients (scripts/run.sh): keys and policies, streams/authn.py", ""]
    for client, policy in (("loadgen", LOADGEN_POLICY), ("cli", OPERATOR_POLICY)):
        (folder / f"{client}.key").write_text(secrets.token_hex(32) + "\n")
        lines += [f"[clients.{client}]", f'key_file = "{client}.key"']
        lines += [f"{action} = {_toml_list(patterns)}" for action, patterns in policy.items()]
        lines.append("")
    (folder / "clients.toml").write_text("\n".join(lines))
    token = secrets.token_urlsafe(24)
    (folder / "tokens.toml").write_text(
        "# The demo's read API tokens (scripts/run.sh), projections/access.py\n\n"
        f'[tokens.dashboard]\nsha256 = "{token_hash(token)}"\naccounts = ["*"]\nsystem = true\n')
    (folder / "demo.env").write_text(
        "# source this to use the CLI against `make run`: sign as client cli, read as the dashboard token\n"
        f"export LEDGER_CLIENT_ID=cli LEDGER_CLIENT_KEY_FILE={folder / 'cli.key'} LEDGER_API_TOKEN={token}\n")
    token_file.write_text(token + "\n")  # last: its presence means every file above is complete
    return token


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))
