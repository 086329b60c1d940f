# The ledger's Python processes (worker, CLI, load generator). Used by docker-compose.yml only.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY streams streams
COPY schemas schemas
COPY projections projections
COPY connectors connectors
RUN pip install --no-cache-dir .
