"""The Faust ceiling: a Faust agent that does nothing with the command records it takes.

Run by benchmarks/engine_bench.py as `python benchmarks/faust_ceiling.py worker` with
LEDGER_TOPIC_PREFIX, KAFKA_BOOTSTRAP, CEILING_RECORDS and CEILING_DIR set. It consumes the commands
topic exactly as streams/app.py does (take_events, same batch size and window) and prints
"records/s <rate>" once it has taken CEILING_RECORDS records: the most any worker built on a Faust agent
can reach on this machine, before it decides anything.
"""
from __future__ import annotations

import os
import time
import uuid

import faust

from streams import config

settings = config.load()
RECORDS = int(os.environ["CEILING_RECORDS"])

app = faust.App(
    f"{settings.prefix}ceiling-{uuid.uuid4().hex[:8]}",
    broker=[f"kafka://{server}" for server in settings.bootstrap.split(",")],
    datadir=os.environ["CEILING_DIR"],
    store="memory://",
    key_serializer="raw",
    value_serializer="raw",
    topic_partitions=settings.partitions,
    topic_allow_declare=False,
    consumer_auto_offset_reset="earliest",
    web_enabled=False,
)
commands = app.topic(settings.topic("commands"), key_type=bytes, value_type=bytes, partitions=settings.partitions)
seen = {"records": 0, "since": 0.0}


@app.agent(commands, concurrency=1)
async def take_only(stream):
    async for events in stream.take_events(config.BATCH_MAX, within=config.BATCH_WINDOW_S):
        if not seen["records"]:
            seen["since"] = time.perf_counter()
        seen["records"] += len(events)
        if seen["records"] >= RECORDS:
            print(f"records/s {seen['records'] / (time.perf_counter() - seen['since']):.0f}", flush=True)
            os._exit(0)


if __name__ == "__main__":
    app.main()
