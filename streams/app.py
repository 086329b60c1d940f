"""The Faust app: one sequential processor per partition, applying commands through streams.engine.

Faust gives us the consumer group, partition assignment across worker processes and offset commits of
acked records. State does not live in Faust tables: each partition has its own RocksDB written in one
WriteBatch per batch of commands, backed by our own changelog topic (docs/engine.md says why).

Run: `ledger worker` (or `faust -A streams.app worker`). Environment: KAFKA_BOOTSTRAP, LEDGER_TOPIC_PREFIX,
LEDGER_PARTITIONS, LEDGER_DATA_DIR (this worker's own directory), LEDGER_SESSION_TIMEOUT_S, LEDGER_ENGINE_KEY
(the key of the engine's seal, given to workers only: streams/seal.py).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import faust
from faust.tables import TableManager
from faust.transport.drivers import aiokafka as faust_aiokafka

from confluent_kafka.admin import AdminClient, ConfigResource

from streams import config, limits, logs, metrics
from streams import authn, batching, membership
from streams.malloc_arenas import cap_malloc_arenas, fix_mmap_threshold
from streams import ticks
from streams.engine import CommandRecord, Engine

log = logging.getLogger("ledger.worker")

cap_malloc_arenas()  # before the engine's RocksDB and producers start their threads
fix_mmap_threshold()  # large blocks (snapshot chunks) mapped apart and returned when freed
settings = config.load()
DATA_DIR = Path(os.environ.get("LEDGER_DATA_DIR", ".state/worker")).resolve()
SESSION_TIMEOUT_S = float(os.environ.get("LEDGER_SESSION_TIMEOUT_S", "10"))
(DATA_DIR / "faust").mkdir(parents=True, exist_ok=True)

class _TablelessManager(TableManager):
    """Faust's table manager, without the second it sleeps when it starts (faust 0.15 TableManager.on_start)
    before it finalises the tables and starts their recovery, which gives tables declared late time to register.
    The ledger declares no Faust table (see the module docstring), so that second only delayed every worker's
    start (and a restarted worker's return to its partitions)."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


app = faust.App(
    f"{settings.prefix}workers",
    TableManager=_TablelessManager,
    Stream=batching.LedgerStream,  # take_batches: the worker's way of taking commands (streams/batching.py)
    broker=[f"kafka://{server}" for server in settings.bootstrap.split(",")],
    # The same SASL / TLS / mTLS / OAUTHBEARER settings as every confluent-kafka client (streams/kafka_security.py).
    broker_credentials=settings.faust_credentials(),
    datadir=str(DATA_DIR / "faust"),
    store="memory://",  # no Faust tables: see the module docstring
    key_serializer="raw",
    value_serializer="raw",  # bytes reach our decoder untouched, so poison cannot crash Faust
    topic_partitions=settings.partitions,
    topic_allow_declare=False,  # `ledger topics create` owns topic configuration
    consumer_auto_offset_reset="earliest",
    broker_session_timeout=SESSION_TIMEOUT_S,
    broker_heartbeat_interval=max(0.5, SESSION_TIMEOUT_S / 10),
    # Not aiokafka's 40 s: a request to a paused broker would hold the group and fetches that long after the
    # cluster moved its partitions (streams/config.py, docs/reliability.md).
    broker_request_timeout=max(config.WORKER_CONSUMER_REQUEST_TIMEOUT_S, SESSION_TIMEOUT_S),
    broker_commit_interval=1.0,
    web_enabled=False,
    logging_config=logs.dict_config(),  # LEDGER_LOG_FORMAT=json: JSON lines instead of Faust's coloured text
)

_create_worker_consumer = faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer


def _read_committed_consumer(self, transport):
    """The commands consumer reads committed records only. Follow-up commands are written in the engine's
    Kafka transactions (streams/engine.py) and a client may write commands transactionally too: a command of
    an aborted transaction must never be decided. Faust asks for read_committed only in its own exactly-once
    mode (faust/transport/drivers/aiokafka.py, _create_worker_consumer), which the ledger does not use; aiokafka
    builds its fetcher from this attribute when the consumer starts."""
    consumer = _create_worker_consumer(self, transport)
    consumer._isolation_level = "read_committed"
    return consumer


faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer = _read_committed_consumer

commands = app.topic(settings.topic("commands"), key_type=bytes, value_type=bytes,
                     partitions=settings.partitions)
engine = Engine(settings, DATA_DIR)
METRICS_PORT = int(os.environ.get("LEDGER_METRICS_PORT", "0"))
METRICS_HOST = os.environ.get("LEDGER_METRICS_HOST", "127.0.0.1")  # the address the metrics listen on


class _Assignment:
    """Faust resumes fetching (its recovery service) while the on_partitions_assigned signal's handlers still run,
    so the agent could take records before the engine has taken the assignment (Engine.assign, which takes a
    moment: one init_transactions per partition). Each rebalance opens a wait at its revocation; the agent waits
    for it to close before it decides anything."""

    def __init__(self):
        self._done: asyncio.Future | None = None

    def begin(self) -> None:
        if self._done is None or self._done.done():
            self._done = asyncio.get_running_loop().create_future()

    def end(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def wait(self) -> None:
        if self._done is not None:
            await self._done


_assignment = _Assignment()


@app.on_partitions_revoked.connect
async def on_revoked(sender, revoked, **kwargs) -> None:
    _assignment.begin()  # Faust sends this once the batch in flight is acked, before the group is rejoined
    engine.invalidate()
    for tp in revoked:  # their lag is another worker's to report now (a quiet worker would keep showing it)
        if _lag.pop(tp, None) is not None:
            metrics.LAG.remove(str(tp.partition))


@app.on_partitions_assigned.connect
async def on_assigned(sender, assigned, **kwargs) -> None:
    """The whole assignment of this generation (the eager protocol): the engine initialises the partitions'
    transactional ids and keeps the membership its transactions send (Engine.assign)."""
    _assignment.begin()
    topic = commands.get_topic_name()
    owned = sorted(tp.partition for tp in assigned if tp.topic == topic)
    try:
        await asyncio.to_thread(engine.assign, owned, _membership())
    except BaseException:
        log.exception("could not take the partitions assigned (%s); exiting", owned)
        logging.shutdown()
        os._exit(70)
    _assignment.end()


def _membership() -> bytes:
    """This worker's membership of the group as of the assignment being handed over: aiokafka's group
    coordinator has set the generation and member id before it calls the listener (streams/membership.py)."""
    coordinator = app.consumer._thread._ensure_consumer()._coordinator
    return membership.group_metadata(coordinator.group_id, coordinator.generation, coordinator.member_id,
                                     coordinator._group_instance_id)


def _topics_too_small() -> list[str]:
    """Topics whose max.message.bytes is below what the ledger's outputs may need (streams/limits.py)."""
    admin = AdminClient(settings.kafka_config())
    names = [settings.topic(n) for n in config.TOPIC_NAMES]
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, n) for n in names])
    small = []
    for resource, future in futures.items():
        value = int(future.result(timeout=30)["max.message.bytes"].value)
        if value < limits.TOPIC_MIN_BYTES:
            small.append(f"{resource.name} has max.message.bytes={value}")
    return small


@app.task
async def check_topic_limits() -> None:
    """A topic that refuses records the ledger may write would stop the worker at its first large output:
    refuse to run instead, saying which (a configuration error, not a command's fault)."""
    try:
        small = await asyncio.to_thread(_topics_too_small)
    except Exception as exc:  # noqa: BLE001 - the check is advisory when the cluster cannot describe configs
        log.warning("could not read the topics' max.message.bytes: %s", exc)
        return
    if small:
        log.error("topics accept smaller records than the ledger may write (needs max.message.bytes >= %d, "
                  "streams/limits.py): %s", limits.TOPIC_MIN_BYTES, "; ".join(small))
        logging.shutdown()
        os._exit(78)  # EX_CONFIG


# How often a worker looks for clients' own results topics made while it runs (Engine.refresh_client_results).
CLIENT_RESULTS_REFRESH_S = float(os.environ.get("LEDGER_CLIENT_RESULTS_REFRESH_S", "15"))


@app.timer(CLIENT_RESULTS_REFRESH_S)
async def refresh_client_results() -> None:
    try:
        await asyncio.to_thread(engine.refresh_client_results)
    except Exception as exc:  # noqa: BLE001 - the next restore or tick tries again; the shared topic has all
        log.warning("could not list the clients' own results topics: %s", exc)


@app.task
async def announce_client_authentication() -> None:
    authn.announce(engine.clients)  # on (which clients file) or open, in the worker's log


@app.task
async def serve_metrics() -> None:
    if METRICS_PORT:
        metrics.serve(METRICS_PORT, METRICS_HOST)
        log.info("metrics on http://%s:%d/metrics", METRICS_HOST, METRICS_PORT)


if ticks.INTERVAL_S > 0:
    @app.timer(ticks.INTERVAL_S)
    async def tick_quiet_partitions() -> None:
        """Time moves on the partitions this worker owns where a hold is due, so it expires without traffic
        (streams/ticks.py)."""
        topic = commands.get_topic_name()
        owned = sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == topic)
        if owned:
            await asyncio.to_thread(engine.produce_ticks, owned)


# Records between each partition's last batch and its end, as of that batch (how far behind the worker is).
_lag: dict = {}


def _observe_lag(events) -> None:
    for tp in batching.observe_lag(app.consumer, events, _lag):  # revoked: another worker reports it now
        metrics.LAG.remove(str(tp.partition))
    for tp, lag in _lag.items():
        metrics.LAG.labels(str(tp.partition)).set(lag)
    totals: dict[str, int] = {}
    for proc in engine.processors.values():
        for currency, posted in proc.clearing.items():
            totals[currency] = totals.get(currency, 0) + posted
    for currency, total in totals.items():
        metrics.CLEARING.labels(currency).set(total)


@app.agent(commands, concurrency=1)
async def ledger_worker(stream):
    def wait_for_more() -> float:  # longer only while behind (streams/batching.py says why)
        # A partition counts when more than a couple of records behind: the high watermark the lag is taken from
        # includes the commit marker of its last transaction (an offset no record is read at).
        owned = app.consumer.assignment()
        behind = sum(lag for tp, lag in _lag.items() if lag > 2 and tp in owned)
        return batching.window(behind, config.BATCH_BEHIND, config.BATCH_WINDOW_S, config.BATCH_WINDOW_IDLE_S)

    async for events in stream.take_batches(config.BATCH_MAX, wait_for_more):
        records = [
            CommandRecord(e.message.partition, e.message.offset, round(e.message.timestamp * 1000),
                          e.message.key, e.message.value, e.message.headers)
            for e in events
        ]
        try:
            await _assignment.wait()
            await engine.process(records)
            if METRICS_PORT:
                metrics.record_latency([r.timestamp_ms for r in records], round(time.time() * 1000))
            _observe_lag(events)
        except BaseException:
            # take_batches acks the batch when this body ends, even by an exception: never let it end so.
            # Exiting here leaves the offsets uncommitted; the restarted worker redoes the batch.
            log.exception("commit path failed; exiting without acknowledging the batch")
            logging.shutdown()
            os._exit(70)


def main() -> None:
    app.main()
