"""How every Kafka client of the ledger authenticates: one set of settings, two client libraries.

The settings are librdkafka client properties (the names confluent-kafka takes), read once from
KAFKA_CONFIG_FILE (a properties file: `name=value` lines, `#` comments) and then from the KAFKA_* variables
below, which win over the file. confluent-kafka clients (the engine's producers, the client library, the
projector, verify, admin) get them as they are (Settings.kafka_config). The worker's Faust consumer runs on
aiokafka, which takes credentials objects and an ssl.SSLContext instead: `faust_credentials` builds those from
the same properties, so no client of a process can connect in another way than the others.

    KAFKA_SECURITY_PROTOCOL       security.protocol    PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    KAFKA_SASL_MECHANISM          sasl.mechanism       PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER
    KAFKA_SASL_USERNAME           sasl.username
    KAFKA_SASL_PASSWORD           sasl.password
    KAFKA_SSL_CA_LOCATION         ssl.ca.location      PEM file of the CA that signed the brokers' certificates
    KAFKA_SSL_CERTIFICATE_LOCATION ssl.certificate.location  PEM client certificate (mTLS)
    KAFKA_SSL_KEY_LOCATION        ssl.key.location     PEM private key of that certificate
    KAFKA_SSL_KEY_PASSWORD        ssl.key.password     if that key is encrypted
    KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM  ssl.endpoint.identification.algorithm  https (default) or none
    KAFKA_SASL_OAUTHBEARER_METHOD sasl.oauthbearer.method  oidc: the client credentials grant below
    KAFKA_SASL_OAUTHBEARER_CLIENT_ID, _CLIENT_SECRET, _TOKEN_ENDPOINT_URL, _SCOPE, _EXTENSIONS

Other properties of the file (socket.keepalive.enable, client.rack, ...) reach the confluent-kafka clients
only; a security property aiokafka cannot honour (a PKCS#12 keystore, Kerberos, inline PEM) is refused for
the worker with the name of what to use instead, rather than letting its consumer connect differently.
A combination that cannot work is refused at start with one line naming the variable (SecurityConfigError).
"""
from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.parse
import urllib.request
from typing import Any

ENV_PROPERTIES = {
    "KAFKA_SECURITY_PROTOCOL": "security.protocol",
    "KAFKA_SASL_MECHANISM": "sasl.mechanism",
    "KAFKA_SASL_USERNAME": "sasl.username",
    "KAFKA_SASL_PASSWORD": "sasl.password",
    "KAFKA_SSL_CA_LOCATION": "ssl.ca.location",
    "KAFKA_SSL_CERTIFICATE_LOCATION": "ssl.certificate.location",
    "KAFKA_SSL_KEY_LOCATION": "ssl.key.location",
    "KAFKA_SSL_KEY_PASSWORD": "ssl.key.password",
    "KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "ssl.endpoint.identification.algorithm",
    "KAFKA_SASL_OAUTHBEARER_METHOD": "sasl.oauthbearer.method",
    "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "sasl.oauthbearer.client.id",
    "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": "sasl.oauthbearer.client.secret",
    "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "sasl.oauthbearer.token.endpoint.url",
    "KAFKA_SASL_OAUTHBEARER_SCOPE": "sasl.oauthbearer.scope",
    "KAFKA_SASL_OAUTHBEARER_EXTENSIONS": "sasl.oauthbearer.extensions",
}
# Where a property came from, for error messages: the variable if one sets it, else the file.
_VARIABLE = {prop: var for var, prop in ENV_PROPERTIES.items()}

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
OIDC_REQUIRED = ("sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
                 "sasl.oauthbearer.token.endpoint.url")
# Security properties librdkafka knows that the worker's aiokafka consumer cannot be given the same way.
_NOT_FOR_AIOKAFKA = {
    "ssl.keystore.location": "ssl.certificate.location and ssl.key.location (PEM files)",
    "ssl.certificate.pem": "ssl.certificate.location (a PEM file)",
    "ssl.key.pem": "ssl.key.location (a PEM file)",
    "ssl.ca.pem": "ssl.ca.location (a PEM file)",
    "sasl.kerberos.service.name": "PLAIN, SCRAM or OAUTHBEARER",
    "sasl.oauthbearer.config": "sasl.oauthbearer.method=oidc with a client id, secret and token endpoint",
}


class SecurityConfigError(ValueError):
    """Security settings that cannot work together; the message names the variable or property."""


def _name(prop: str) -> str:
    var = _VARIABLE.get(prop)
    return f"{var} ({prop})" if var else prop


def read_properties_file(path: str) -> dict[str, str]:
    """A librdkafka-style properties file: `name=value` per line, blank lines and `#`/`!` comments skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise SecurityConfigError(f"KAFKA_CONFIG_FILE={path!r} cannot be read: {exc.strerror}") from None
    props: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text[0] in "#!":
            continue
        name, sep, value = text.partition("=")
        if not sep or not name.strip():
            raise SecurityConfigError(f"KAFKA_CONFIG_FILE={path!r} line {number} is not name=value")
        props[name.strip()] = value.strip()
    return props


def from_env(env: dict[str, str]) -> dict[str, str]:
    """The client properties of this process (file first, variables over it), checked (check)."""
    props: dict[str, str] = {}
    if env.get("KAFKA_CONFIG_FILE"):
        props.update(read_properties_file(env["KAFKA_CONFIG_FILE"]))
    props.update({prop: env[var] for var, prop in ENV_PROPERTIES.items() if env.get(var)})
    check(props)
    return props


def check(props: dict[str, str]) -> None:
    """Refuse combinations that cannot authenticate, before any client tries (and retries) to connect."""
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise SecurityConfigError(f"{_name('security.protocol')}={protocol!r} is not one of {', '.join(PROTOCOLS)}")
    sasl = [p for p in props if p.startswith("sasl.")]
    ssl = [p for p in props if p.startswith("ssl.")]
    if sasl and not protocol.startswith("SASL_"):
        raise SecurityConfigError(f"{_name(sasl[0])} is set but {_name('security.protocol')} is {protocol}: "
                                  f"use SASL_SSL (or SASL_PLAINTEXT)")
    if ssl and not protocol.endswith("SSL"):
        raise SecurityConfigError(f"{_name(ssl[0])} is set but {_name('security.protocol')} is {protocol}: "
                                  f"use SSL or SASL_SSL")
    if ("ssl.certificate.location" in props) != ("ssl.key.location" in props):
        raise SecurityConfigError(f"a client certificate needs both {_name('ssl.certificate.location')} and "
                                  f"{_name('ssl.key.location')}")
    identification = props.get("ssl.endpoint.identification.algorithm", "https").lower()
    if identification not in ("https", "none"):
        raise SecurityConfigError(f"{_name('ssl.endpoint.identification.algorithm')}={identification!r} is not "
                                  f"https or none")
    if not protocol.startswith("SASL_"):
        return
    mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "")).upper()
    if not mechanism:
        raise SecurityConfigError(f"{_name('security.protocol')}={protocol} needs {_name('sasl.mechanism')}: "
                                  f"one of {', '.join(MECHANISMS)}")
    if mechanism not in MECHANISMS:
        raise SecurityConfigError(f"{_name('sasl.mechanism')}={mechanism!r} is not one of {', '.join(MECHANISMS)}")
    if mechanism == "OAUTHBEARER":
        if props.get("sasl.oauthbearer.method", "default").lower() == "oidc":
            missing = [p for p in OIDC_REQUIRED if not props.get(p)]
            if missing:
                raise SecurityConfigError(f"sasl.oauthbearer.method=oidc needs {_name(missing[0])}")
        elif "sasl.oauthbearer.config" not in props:
            raise SecurityConfigError(f"{_name('sasl.mechanism')}=OAUTHBEARER needs "
                                      f"{_name('sasl.oauthbearer.method')}=oidc (or sasl.oauthbearer.config for "
                                      f"librdkafka's unsecured test tokens)")
        return
    for prop in ("sasl.username", "sasl.password"):
        if not props.get(prop):
            raise SecurityConfigError(f"{_name('sasl.mechanism')}={mechanism} needs {_name(prop)}")


# --- aiokafka (the worker's Faust consumer and producer) -------------------------------------------------------
def ssl_context(props: dict[str, str]):
    """The ssl.SSLContext that matches librdkafka's reading of the same properties."""
    from aiokafka.helpers import create_ssl_context

    context = create_ssl_context(cafile=props.get("ssl.ca.location"),
                                 certfile=props.get("ssl.certificate.location"),
                                 keyfile=props.get("ssl.key.location"),
                                 password=props.get("ssl.key.password"))
    if props.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        context.check_hostname = False  # librdkafka's `none`: the chain is still verified, the name is not
    return context


def faust_credentials(props: dict[str, str]) -> Any:
    """faust's broker_credentials for these properties (None for PLAINTEXT)."""
    import faust

    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    for prop, instead in _NOT_FOR_AIOKAFKA.items():
        if prop in props:
            raise SecurityConfigError(f"{prop} cannot be given to the worker's consumer (aiokafka); use {instead}")
    context = ssl_context(props) if protocol.endswith("SSL") else None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "")).upper()
    if mechanism == "OAUTHBEARER":
        return faust.OAuthCredentials(oauth_cb=oidc_token_provider(props), ssl_context=context)
    return faust.SASLCredentials(username=props["sasl.username"], password=props["sasl.password"],
                                 ssl_context=context, mechanism=mechanism)


class OidcTokens:
    """OAUTHBEARER tokens by the OAuth 2 client credentials grant, fetched the way librdkafka's
    sasl.oauthbearer.method=oidc fetches them: POST grant_type=client_credentials (and the scope) to the token
    endpoint with the client id and secret as HTTP basic auth; a token is reused until a minute before it
    expires."""

    REFRESH_MARGIN_S = 60.0

    def __init__(self, props: dict[str, str]):
        self.endpoint = props["sasl.oauthbearer.token.endpoint.url"]
        self.client_id = props["sasl.oauthbearer.client.id"]
        self.client_secret = props["sasl.oauthbearer.client.secret"]
        self.scope = props.get("sasl.oauthbearer.scope")
        self.extensions = dict(pair.split("=", 1) for pair in
                               props.get("sasl.oauthbearer.extensions", "").split(",") if "=" in pair)
        self._token: str | None = None
        self._expires_at = 0.0

    def _fetch(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        basic = base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        request = urllib.request.Request(self.endpoint, data=urllib.parse.urlencode(form).encode(),
                                         headers={"Authorization": f"Basic {basic}",
                                                  "Content-Type": "application/x-www-form-urlencoded"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.load(response)
        return body["access_token"], time.monotonic() + float(body.get("expires_in", 300))

    async def token(self) -> str:
        if self._token is None or time.monotonic() > self._expires_at - self.REFRESH_MARGIN_S:
            self._token, self._expires_at = await asyncio.get_running_loop().run_in_executor(None, self._fetch)
        return self._token


def oidc_token_provider(props: dict[str, str]):
    """aiokafka's token provider over OidcTokens (aiokafka imported here only: clients never need it)."""
    from aiokafka.abc import AbstractTokenProvider

    tokens = OidcTokens(props)

    class Provider(AbstractTokenProvider):
        async def token(self) -> str:
            return await tokens.token()

        def extensions(self) -> dict[str, str]:
            return tokens.extensions

    return Provider()

