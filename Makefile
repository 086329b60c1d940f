# The two commands a new machine needs: `make run` (the ledger with demo traffic) and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: lock install broker broker-stop topics run demo test test-long test-core bench bench-scale bench-client bench-commit bench-read bench-restore bench-memory soak-memory bench-core soak kill-soak faults clean mutate fuzz fuzz-decode

$(STAMP): pyproject.toml constraints.txt
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required, found " + sys.version.split()[0])'
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test,registry,native]'
	@touch $(STAMP)

install: $(STAMP)
	$(BIN)/python -m schemas.cdecode build
	scripts/kafka.sh fetch

broker: install
	scripts/kafka.sh start

broker-stop:
	scripts/kafka.sh stop

topics: broker
	$(BIN)/ledger topics create

# Broker (unless KAFKA_BOOTSTRAP is set), topics, worker, demo traffic; Ctrl-C stops what it started.
# SECURE=1: on a secured local broker, each process as its own principal (docs/security.md).
run: install
	SECURE=$(SECURE) scripts/run.sh

demo: install
	scripts/with-broker.sh $(BIN)/ledger demo

# The broker and a PostgreSQL server (the read store's second backend), each started here unless running.
# Every test but those marked `long`, which run in `make test-long` (docs/testing.md, "What make test runs").
test: install
	scripts/with-broker.sh scripts/with-postgres.sh $(BIN)/pytest -q -m "not long" $(PYTEST_ARGS)

# Exactly the tests marked `long`: the long kill -9 loops and every crash point with the larger backlog
# (about 5 minutes on 2 cores); `make test` runs a short version of each.
test-long: install
	scripts/with-broker.sh $(BIN)/pytest -q -m long $(PYTEST_ARGS)

test-core: $(STAMP)
	$(BIN)/pytest -q tests/core

# Mutation testing of the pure core and the partition shell against the broker-free tests (docs/testing.md);
# not part of `make test`. Prints the score per area and the surviving mutants. MUTATE_ARGS="--sample 150"
# checks a seeded random sample per area and prints each score with its 95% interval.
$(VENV)/.installed-mutate: $(STAMP)
	$(BIN)/pip install -q -c constraints.txt -e '.[test,mutate]'
	@touch $@

mutate: $(VENV)/.installed-mutate
	$(BIN)/python scripts/mutate.py $(MUTATE_ARGS)

# First the compiled Avro decoders alone (fuzz-decode), then a long seeded fuzz run of the commands topic against
# a real worker (tests/adversary.py, scripts/fuzz.py): records sent by class, results, dead letters, worker exits
# (must be 0) and verify's verdict. FUZZ_ARGS="--seed 7 --noise 50000" for another run.
fuzz: install fuzz-decode
	scripts/with-broker.sh $(BIN)/python scripts/fuzz.py $(FUZZ_ARGS)

# No broker: every schema's compiled decoder (schemas/cdecode.py) built with AddressSanitizer and fed seeded
# random, truncated and mutated bytes, each answer compared with the generated Python decoder's
# (scripts/fuzz_cdecode.py, about 3 minutes). FUZZ_DECODE_ARGS="--cases 1000000 --seed 7" for a longer run.
fuzz-decode: $(STAMP)
	$(BIN)/python scripts/fuzz_cdecode.py $(FUZZ_DECODE_ARGS)

bench: install
	scripts/with-broker.sh $(BIN)/python benchmarks/engine_bench.py

# Throughput with 1, 2 and 4 workers on a 3-node cluster of its own (scripts/bench-scale.sh).
bench-scale: install
	scripts/bench-scale.sh $(BENCH_ARGS)

bench-client: install
	scripts/with-broker.sh $(BIN)/python benchmarks/client_bench.py

# Where a command's latency goes between partitions: the broker's price of a worker's commit (N concurrent
# transactions over K partitions each), then produce->result by kind through a worker (docs/engine.md,
# "One Kafka transaction per partition per batch"). BENCH_COMMIT_ARGS="--partitions 2 --rates 20,200,400".
bench-commit: install
	scripts/with-broker.sh $(BIN)/python benchmarks/commit_bench.py $(BENCH_COMMIT_ARGS)

bench-read: install
	scripts/with-broker.sh scripts/with-postgres.sh $(BIN)/python benchmarks/replay_bench.py
	$(BIN)/python benchmarks/load_bench.py

# Restore time of a worker without local state against history length, with and without snapshots.
# BENCH_RESTORE_ARGS="--sizes 10000,100000,1000000" for the long version.
bench-restore: install
	scripts/with-broker.sh $(BIN)/python benchmarks/restore_bench.py $(BENCH_RESTORE_ARGS)

# Worker memory in process against commands decided (no Kafka): BENCH_MEMORY_ARGS="--decided 1000000".
bench-memory: $(STAMP)
	$(BIN)/python benchmarks/memory_bench.py $(BENCH_MEMORY_ARGS)

# A real worker's RSS over a million commands of the load generator's mix, every 100,000. At 700 commands/s the
# worker is the limit: on 2 cores it answered 180-200/s, about 90 minutes (docs/engine.md, Memory).
SOAK_MEMORY_ARGS ?= --decided 1000000 --every 100000 --rate 700
soak-memory: install
	scripts/with-broker.sh $(BIN)/python benchmarks/memory_bench.py --worker $(SOAK_MEMORY_ARGS)

# No broker: the pure core alone, then the worker's whole batch path (decode to RocksDB) by phase.
bench-core: $(STAMP)
	$(BIN)/python benchmarks/core_bench.py --n 60000
	$(BIN)/python benchmarks/engine_core_bench.py

# The soak: 30 kill -9 of a worker under load with the exactly-once oracles (kill-soak), then a real worker's RSS
# every 100,000 of 1,000,000 commands (soak-memory). About two hours on 2 cores; each half runs alone too.
soak: kill-soak soak-memory

kill-soak: install
	scripts/with-broker.sh $(BIN)/python benchmarks/kill_soak.py

# The fault suite (benchmarks/faults.py, docs/reliability.md): a 3-node cluster of its own (.state/faults, ports
# 29092-29094) with every scenario under load and every oracle after each, one table row per scenario; then the
# long tests (make test-long) on the shared broker. FAULTS_ARGS="--only leader-kill --rate 20" for part of it.
faults: install
	$(BIN)/python benchmarks/faults.py $(FAULTS_ARGS)
	scripts/with-broker.sh $(BIN)/pytest -q -m long

clean: broker-stop
	scripts/postgres.sh stop
	rm -rf .state schemas/_native

# After changing dependencies in pyproject.toml: resolve them afresh, then pin what make test passed with.
lock:
	rm -rf $(VENV) && $(PY) -m venv $(VENV) && $(BIN)/pip install -q --upgrade pip && $(BIN)/pip install -q -e '.[test,mutate,registry]'
	{ sed -n '1,2p' constraints.txt; $(BIN)/pip freeze --exclude-editable; } > constraints.new && mv constraints.new constraints.txt
	@touch $(STAMP) $(VENV)/.installed-mutate
