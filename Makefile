# idemq — `make help` lists the targets.
#
# `make demo` and `make test` work on a fresh Debian machine: they start the
# services they need (Postgres, Redis from apt; Kafka and RocketMQ from Maven
# Central jars on Java 17) through scripts/services.sh.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go
SERVICES := scripts/services.sh
# Exports TEST_POSTGRES_DSN, TEST_REDIS_ADDR, TEST_KAFKA_BROKERS, TEST_ROCKETMQ_NAMESRV, TEST_PGBOUNCER_DSN, ...
ENV := eval "$$(bash $(SERVICES) env)"

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}'

.PHONY: services-up
services-up: ## install (if needed) and start Postgres, Redis, Kafka, RocketMQ, PgBouncer (transaction mode, before Postgres) on 127.0.0.1
	bash $(SERVICES) up

.PHONY: services-down
services-down: ## stop the services
	bash $(SERVICES) down

.PHONY: services-status
services-status: ## show the services' state
	bash $(SERVICES) status

# DEMO=kafka, rocketmq, outbox or http runs one demo; the default runs all four.
DEMO ?= all

.PHONY: demo
demo: services-up ## run the demos on real services: Kafka and RocketMQ redelivery (idemq vs naive), outbox pipeline, HTTP payments (idemq vs naive) (DEMO=kafka|rocketmq|outbox|http|all)
	@$(ENV); \
	if [ "$(DEMO)" = all ] || [ "$(DEMO)" = kafka ]; then echo "== Kafka: payments =="; $(GO) run ./examples/payments demo; fi; \
	if [ "$(DEMO)" = all ] || [ "$(DEMO)" = rocketmq ]; then echo; echo "== RocketMQ: orders =="; $(GO) run ./examples/rocketmq-orders demo; fi; \
	if [ "$(DEMO)" = all ] || [ "$(DEMO)" = outbox ]; then echo; echo "== Outbox: order pipeline =="; $(GO) run ./examples/order-pipeline demo; fi; \
	if [ "$(DEMO)" = all ] || [ "$(DEMO)" = http ]; then echo; echo "== HTTP: payments (Idempotency-Key, submit token, guarded transitions) =="; $(GO) run ./examples/http-payments demo; fi

.PHONY: test
test: services-up test-unit test-integration test-postgres-oldest ## unit + integration tests with -race on real services, then again on the oldest Postgres (what CI runs)

.PHONY: test-unit
test-unit: ## unit tests and examples; the SQL package tests (dedup/pgstore) use the running Postgres (`make services-up` first; `make test` does)
	$(GO) vet ./...
	$(ENV); $(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run 'Allocations' ./consumer/ # allocation counts: without -race (consumer/allocs_test.go)

.PHONY: test-integration
test-integration: ## integration tests against the running services (fail, never skip, when CI=true)
	mkdir -p .cache
	$(ENV); export TEST_REQUIRE_BROKERS=1; cd integration && $(GO) vet ./... && \
	  rc=0; $(GO) tool gotestsum --format testname --format-hide-empty-pkg \
	    --jsonfile ../.cache/integration.json -- -race -count=1 -timeout 30m ./... \
	    > ../.cache/integration.log 2>&1 || rc=$$?; \
	  cat ../.cache/integration.log; \
	  [ $$rc -eq 0 ] || echo "integration tests failed; every event is in .cache/integration.json (go test -json)"; \
	  exit $$rc

# The oldest supported Postgres (13, from the npm registry: Debian ships one major) runs every
# integration test that touches Postgres. Skipped there, and why: the Redis-only store's tests
# (no Postgres in them) and the two table-scan tests, which read statistics through
# pg_stat_force_next_flush(), a Postgres 15 function.
.PHONY: test-postgres-oldest
test-postgres-oldest: ## the store's SQL package tests and the integration tests on PostgreSQL 13, the oldest supported (scripts/postgres-oldest.sh)
	mkdir -p .cache
	bash scripts/postgres-oldest.sh up
	$(ENV); eval "$$(bash scripts/postgres-oldest.sh env)"; export CI=true; \
	  $(GO) test -race -count=1 -skip 'NoTableScan' ./dedup/pgstore/ ./outbox/
	$(ENV); eval "$$(bash scripts/postgres-oldest.sh env)"; export TEST_REQUIRE_BROKERS=1; cd integration && \
	  rc=0; $(GO) tool gotestsum --format testname --format-hide-empty-pkg \
	    --jsonfile ../.cache/integration-postgres-oldest.json -- -race -count=1 -timeout 30m \
	    -skip 'TestRedisStore|TestStoreConformanceRedis|NoTableScan' ./... > ../.cache/integration-postgres-oldest.log 2>&1 || rc=$$?; \
	  cat ../.cache/integration-postgres-oldest.log; \
	  [ $$rc -eq 0 ] || echo "integration tests on the oldest Postgres failed; every event is in .cache/integration-postgres-oldest.json"; \
	  exit $$rc

# Not part of `make test`: a few minutes on the real broker. DRILL_MESSAGES and DRILL_KILLS
# change the defaults (3000 messages, 20 kills); DRILL_ARGS passes other flags (see -h).
DRILL_ARGS ?=

.PHONY: drill-rocketmq
drill-rocketmq: services-up ## RocketMQ SIGKILL backlog drill, push vs pull: N messages, 2 consumer processes, K kills, graceful stop; prints deliveries/message, duplicates, lag (DRILL_MESSAGES, DRILL_KILLS)
	$(ENV); $(GO) run ./examples/rocketmq-drill run $(DRILL_ARGS)

# The topology drills (integration/cmd/drill, scripts/topology/): each starts its topology from
# Debian packages and the broker jars, runs its faults while messages flow, checks exactly-once
# from durable state, prints a summary table and stops what it started. Not part of `make test`;
# `make drill-smoke` runs a short one of each (CI does). DRILL_ARGS passes the drill's flags
# (`cd integration && go run ./cmd/drill NAME -h`).
DRILL := cd integration && $(GO) run ./cmd/drill

.PHONY: drill-pg-failover
drill-pg-failover: ## Postgres primary + streaming standby (sync, then async) on 127.0.0.1:5441/5442: the primary SIGKILLed and the standby promoted while atomic, batched and lease consumers and the relay run; duplicates, lost, order, recovery time
	bash $(SERVICES) up kafka
	$(ENV); $(DRILL) pg-failover $(DRILL_ARGS)

.PHONY: drill-clock-skew
drill-clock-skew: ## two workers built with wall clocks 5 minutes apart (go build -overlay) share lease records, consumption records and HTTP keys on Postgres: takeover, expiry and purge follow the database clock
	bash $(SERVICES) up postgres
	$(ENV); $(DRILL) clock-skew $(DRILL_ARGS)

.PHONY: drill-redis-failover
drill-redis-failover: ## Redis master + replica + 3 Sentinels on 127.0.0.1:6391/6392, 26391-26393: the master SIGKILLed (replica stopped first) under the fast path, the Redis-only store and submit tokens; duplicates, lost records, recovery time
	bash $(SERVICES) up postgres kafka
	$(ENV); $(DRILL) redis-failover $(DRILL_ARGS)

.PHONY: drill-kafka-cluster
drill-kafka-cluster: ## three KRaft brokers on 127.0.0.1:19092-19094 (RF 3, min.insync.replicas 2): partition leaders SIGKILLed and restarted, partitions added (kafka-topics) and offsets reset to earliest (kafka-consumer-groups) while a group of two consumes and the relay publishes; duplicates, lost, order, offsets never backwards, recovery per kill
	bash $(SERVICES) up postgres
	$(ENV); $(DRILL) kafka-cluster $(DRILL_ARGS)

.PHONY: drill-partition
drill-partition: ## the consumer, the relay and the HTTP middleware reach Postgres through toxiproxy (in-process): latency, a cut, a black hole, a slow close while they work; recovery per fault, duplicates, lost, order
	bash $(SERVICES) up postgres kafka
	$(ENV); $(DRILL) partition $(DRILL_ARGS)

.PHONY: drill-smoke
drill-smoke: ## a short run of every topology drill (.ci/run runs it before `make test`)
	bash $(SERVICES) up postgres kafka
	$(ENV); $(DRILL) pg-failover -messages 600 -settle 5s
	$(ENV); $(DRILL) clock-skew
	$(ENV); $(DRILL) partition -messages 600 -requests 80 -window 2s
	$(ENV); $(DRILL) redis-failover -messages 400 -tokens 600 -settle 2s
	$(ENV); $(DRILL) kafka-cluster -kills 1 -rate 30 -settle 2s

# `make bench` is the proof of idemq's throughput: integration/cmd/benchreport measures, in one run,
# the rooflines (pgbench on tables of idemq's row shapes, pg_test_fsync, raw kafka-go) and the same
# workloads through idemq, prints the table with the ratios and the targets, and rewrites
# docs/benchmarks.md and docs/benchmarks.svg. About 5 minutes on 2 cores, plus the first build; BENCH_ARGS passes flags
# (see `go run ./cmd/benchreport -h` in integration/, e.g. BENCH_ARGS='-runs 5').
BENCH_ARGS ?=

.PHONY: bench
bench: services-up ## the benchmark report: idemq beside pgbench / kafka-go rooflines measured in the same run (ratios, WAL syncs, allocations, added latency, targets); rewrites docs/benchmarks.md (BENCH_ARGS)
	$(ENV); cd integration && $(GO) run ./cmd/benchreport -go "$(GO)" $(BENCH_ARGS)

.PHONY: bench-go
bench-go: services-up ## the go test benchmarks of the integration module: dedup overhead vs a plain transaction, crash-loop markers on vs off, Redis down vs Postgres only, batched 100/tx, the Redis-only store vs SET NX, relay vs a raw producer
	$(ENV); cd integration && \
	  $(GO) test -run '^$$' -bench DedupOverhead -benchtime 2000x -count 1 . && \
	  $(GO) test -run '^$$' -bench CrashLoopOverhead -benchtime 2000x -count 1 . && \
	  $(GO) test -run '^$$' -bench FastPathRedisDown -benchtime 4000x -count 1 . && \
	  $(GO) test -run '^$$' -bench Batch100 -benchtime 20000x -count 1 . && \
	  $(GO) test -run '^$$' -bench RedisStoreOverhead -benchtime 5000x -count 1 . && \
	  $(GO) test -run '^$$' -bench RelayThroughput -benchtime 3x -count 1 .

# Not part of `make test`: BenchmarkPurgeAtScale (integration/purge_scale_bench_test.go) loads PURGE_ROWS
# consumption records (default 10,000,000; about 30 minutes on 2 busy cores, 22 of them loading; about 4 GB in its own schema,
# dropped at the end), then measures batched ingest alone and while the maintenance loop purges the
# expired backlog. PURGE_ROWS=200000 checks the benchmark itself in about a minute. PURGE_LANES,
# PURGE_BATCH and PURGE_WINDOW change the ingest lanes (4), the purge's Batch (1000) and the window
# of ingest alone (60s).
PURGE_ROWS ?= 10000000
PURGE_LANES ?= 4
PURGE_BATCH ?= 1000
PURGE_WINDOW ?= 60s

.PHONY: bench-purge
bench-purge: services-up ## purge at scale: PURGE_ROWS records (10 M), ingest alone vs during RunMaintenance's purge; prints purge rows/s ÷ ingest msgs/s, sizes, n_dead_tup, VACUUM time (PURGE_ROWS, PURGE_LANES, PURGE_BATCH, PURGE_WINDOW)
	$(ENV); export TEST_REQUIRE_BROKERS=1 IDEMQ_PURGE_SCALE_ROWS=$(PURGE_ROWS) IDEMQ_PURGE_SCALE_LANES=$(PURGE_LANES) \
	  IDEMQ_PURGE_SCALE_BATCH=$(PURGE_BATCH) IDEMQ_PURGE_SCALE_WINDOW=$(PURGE_WINDOW); cd integration && \
	  $(GO) test -v -run '^$$' -bench PurgeAtScale -benchtime 1x -count 1 -timeout 80m .

.PHONY: fuzz
fuzz: ## fuzz the identity normalization for 30s
	$(GO) test ./dedup -run '^$$' -fuzz FuzzNormalizeKey -fuzztime 30s

# golangci-lint is pinned in tools/go.mod (its own module, so its dependencies
# stay out of idemq's); the first run builds it, later runs reuse the build cache.
GOLANGCI_LINT := $(GO) tool -modfile=$(CURDIR)/tools/go.mod golangci-lint

.PHONY: lint
lint: ## gofmt check, go vet, and golangci-lint (errcheck, staticcheck, revive, gosec, bodyclose; .golangci.yml) on the root and integration modules
	@test -z "$$(gofmt -l . | tee /dev/stderr)"
	$(GO) vet ./...
	cd integration && $(GO) vet ./...
	$(GOLANGCI_LINT) run ./...
	cd integration && $(GOLANGCI_LINT) run ./...
