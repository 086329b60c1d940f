# The ledger's Python processes (worker, CLI, load generator). Used by docker-compose.yml only.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY streams streams
COPY schemas schemas
COPY projections projections
COPY connectors connectors
# The Avro decoders compiled to C (schemas/cdecode.py) need a compiler at build time only; they are built
# from /tmp so that the installed package (not the copied source) is the one that finds them.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir -c constraints.txt '.[registry,native]' \
    && cd /tmp && python -m schemas.cdecode build \
    && python -c 'import shutil, schemas.cdecode as c; shutil.rmtree(c.NATIVE_DIR / "build")' && cd /app \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 ledger && mkdir -p /data && chown ledger /data
# Not root: a worker needs only its state directory (LEDGER_DATA_DIR) and the network.
USER ledger
ENV LEDGER_DATA_DIR=/data
