"""One set of Kafka security settings (streams/kafka_security.py), without a broker: what is refused with one
line, what the file and the variables give, and what the worker's Faust consumer receives."""
from __future__ import annotations

import asyncio
import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs

import faust
import pytest

from streams import config

SCRAM = {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
         "KAFKA_SASL_USERNAME": "worker", "KAFKA_SASL_PASSWORD": "secret"}


@pytest.mark.parametrize("env,message", [
    ({"KAFKA_SASL_USERNAME": "a"}, "KAFKA_SASL_USERNAME (sasl.username) is set but KAFKA_SECURITY_PROTOCOL"),
    ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "needs KAFKA_SASL_MECHANISM"),
    ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "GSSAPI"}, "is not one of PLAIN"),
    ({**SCRAM, "KAFKA_SASL_PASSWORD": ""}, "needs KAFKA_SASL_PASSWORD"),
    ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "'TLS' is not one of PLAINTEXT"),
    ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERTIFICATE_LOCATION": "c.pem"}, "needs both"),
    ({"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USERNAME": "a",
      "KAFKA_SASL_PASSWORD": "b", "KAFKA_SSL_CA_LOCATION": "ca.pem"}, "use SSL or SASL_SSL"),
    ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "OAUTHBEARER",
      "KAFKA_SASL_OAUTHBEARER_METHOD": "oidc", "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "x"},
     "needs KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET"),
    ({"KAFKA_CONFIG_FILE": "/nonexistent/ledger.properties"}, "cannot be read"),
])
def test_settings_that_cannot_work_are_one_line_naming_the_variable(env, message):
    with pytest.raises(config.ConfigError) as refused:
        config.load(env)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_config_file_gives_client_properties_and_variables_win(tmp_path):
    path = tmp_path / "client.properties"
    path.write_text("# a librdkafka properties file\nsecurity.protocol=SASL_PLAINTEXT\n"
                    "sasl.mechanism=PLAIN\nsasl.username=from-file\nsasl.password = pw\n\n"
                    "socket.keepalive.enable=true\n")
    settings = config.load({"KAFKA_CONFIG_FILE": str(path), "KAFKA_SASL_USERNAME": "from-env"})
    kafka = settings.kafka_config()
    assert kafka["sasl.username"] == "from-env" and kafka["sasl.password"] == "pw"
    assert kafka["socket.keepalive.enable"] == "true"  # any other property reaches librdkafka as it is
    creds = settings.faust_credentials()
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == ("from-env", "pw", "PLAIN")


def test_a_malformed_config_file_line_is_named(tmp_path):
    path = tmp_path / "bad.properties"
    path.write_text("security.protocol=SSL\nthis line has no equals sign\n")
    with pytest.raises(config.ConfigError, match="line 2 is not name=value"):
        config.load({"KAFKA_CONFIG_FILE": str(path)})


def test_faust_gets_what_the_confluent_clients_get():
    assert config.load({}).faust_credentials() is None  # PLAINTEXT
    creds = config.load(SCRAM).faust_credentials()
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.protocol.value, creds.mechanism.value, creds.username) == ("SASL_PLAINTEXT", "SCRAM-SHA-512",
                                                                             "worker")


def test_a_property_aiokafka_cannot_take_is_refused_for_the_worker(tmp_path):
    path = tmp_path / "keystore.properties"
    path.write_text("security.protocol=SSL\nssl.keystore.location=/etc/kafka/client.p12\n")
    settings = config.load({"KAFKA_CONFIG_FILE": str(path)})  # confluent-kafka clients can use it
    with pytest.raises(config.ConfigError, match="ssl.keystore.location cannot be given to the worker"):
        settings.faust_credentials()


class _TokenEndpoint(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        self.seen.append((self.headers["Authorization"], form))
        body = json.dumps({"access_token": f"token-{len(self.seen)}", "expires_in": 3600}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_oauthbearer_oidc_gives_faust_a_token_provider_doing_the_client_credentials_grant():
    server = HTTPServer(("127.0.0.1", 0), _TokenEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = config.load({
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "OAUTHBEARER",
            "KAFKA_SASL_OAUTHBEARER_METHOD": "oidc", "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "ledger-worker",
            "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": "s3cret", "KAFKA_SASL_OAUTHBEARER_SCOPE": "kafka",
            "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": f"http://127.0.0.1:{server.server_port}/token"})
        assert settings.kafka_config()["sasl.oauthbearer.method"] == "oidc"  # librdkafka does the grant itself
        creds = settings.faust_credentials()
        assert isinstance(creds, faust.OAuthCredentials)

        async def twice():
            return await creds.oauth_cb.token(), await creds.oauth_cb.token()

        assert asyncio.run(twice()) == ("token-1", "token-1")  # fetched once, reused until near its expiry
        auth, form = _TokenEndpoint.seen[0]
        assert auth == "Basic " + base64.b64encode(b"ledger-worker:s3cret").decode()
        assert form == {"grant_type": ["client_credentials"], "scope": ["kafka"]}
    finally:
        server.shutdown()

