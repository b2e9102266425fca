package integration

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
)

// The schema is checked by default, read-only, before anything runs:
// consumer.Run on a real Kafka topic refuses a missing and an outdated
// record schema (no handler call, no offset committed, the error naming the
// versions and the command), the relay refuses a missing and an outdated
// outbox schema (the row stays unpublished), and a data-only role on a
// current schema starts and consumes (the check needs no DDL).
// SkipSchemaCheck turns it off.
func TestSchemaCheckedByDefault(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	topic := newTopic(t, 1)
	produce(t, topic, kmsg{id: "schema-1", payload: "p1"})

	var handled atomic.Int64
	handler := func(context.Context, pgx.Tx, *dedup.Message) error { handled.Add(1); return nil }
	run := func(st *pgstore.Store, group string, skip bool) error {
		t.Helper()
		c, err := consumer.New(consumer.Config{Scope: group, Store: st, Handler: handler, SkipSchemaCheck: skip})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		defer cancel()
		return c.Run(ctx, newSpySource(t, group, topic))
	}

	// Missing: a schema nothing was ever migrated into.
	missing, err := pgstore.New(e.pool, pgstore.Config{Schema: randomName("t_"), Fingerprinter: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
	group := randomName("g-")
	if err := run(missing, group, false); !errors.Is(err, pgstore.ErrSchemaMissing) || !strings.Contains(err.Error(), "idemq migrate") {
		t.Fatalf("Run on a missing schema = %v; want ErrSchemaMissing naming `idemq migrate`", err)
	}
	if handled.Load() != 0 || groupOffset(t, group, topic) != -1 {
		t.Fatalf("missing schema: %d handler calls, committed offset %d; want none", handled.Load(), groupOffset(t, group, topic))
	}

	// Outdated: the version table one behind.
	vt := e.table("consumption_records_schema_version")
	var want int
	if err := e.pool.QueryRow(e.ctx, "select version from "+vt).Scan(&want); err != nil {
		t.Fatal(err)
	}
	e.exec("update "+vt+" set version = $1", want-1)
	group = randomName("g-")
	var se *pgstore.SchemaError
	if err := run(e.store, group, false); !errors.Is(err, pgstore.ErrSchemaOutdated) || !errors.As(err, &se) || se.Found != want-1 || se.Want != want {
		t.Fatalf("Run on an outdated schema = %v; want ErrSchemaOutdated found %d want %d", err, want-1, want)
	}
	if handled.Load() != 0 || groupOffset(t, group, topic) != -1 {
		t.Fatalf("outdated schema: %d handler calls, committed offset %d; want none", handled.Load(), groupOffset(t, group, topic))
	}
	// SkipSchemaCheck: the operator manages the tables; Run consumes.
	if err := runUntilHandled(t, e, group, topic, e.store, handler, &handled, true); err != nil {
		t.Fatal(err)
	}
	e.exec("update "+vt+" set version = $1", want)

	// Current, as a data-only role: the check passes without DDL rights.
	data := dataOnlyRole(t, e)
	st, err := pgstore.New(data, pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
	handled.Store(0)
	if err := runUntilHandled(t, e, randomName("g-"), topic, st, handler, &handled, false); err != nil {
		t.Fatal(err)
	}

	// The relay: missing, then outdated outbox schemas are refused; the row
	// stays unpublished.
	var published atomic.Int64
	pub := outbox.PublisherFunc(func(_ context.Context, batch []outbox.Envelope) error {
		published.Add(int64(len(batch)))
		return nil
	})
	never, err := outbox.New(e.pool, outbox.Config{Schema: e.schema, Table: "never_migrated"})
	if err != nil {
		t.Fatal(err)
	}
	relayRun := func(ob *outbox.Outbox) error {
		r, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{PollInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
		defer cancel()
		return r.Run(ctx)
	}
	if err := relayRun(never); !errors.Is(err, outbox.ErrSchemaMissing) {
		t.Fatalf("Relay.Run on a missing outbox schema = %v; want ErrSchemaMissing", err)
	}
	ob := e.outboxWith(outbox.Message{Topic: "t", Payload: []byte("x")})
	e.exec("update " + e.table("outbox_schema_version") + " set version = 1")
	if err := relayRun(ob); !errors.Is(err, outbox.ErrSchemaOutdated) {
		t.Fatalf("Relay.Run on an outdated outbox schema = %v; want ErrSchemaOutdated", err)
	}
	if published.Load() != 0 || e.count("select count(*) from "+e.table("outbox")+" where published_at is null") != 1 {
		t.Fatalf("outdated outbox: %d published; want the row kept unpublished", published.Load())
	}
}

// runUntilHandled runs a consumer on topic until the handler ran once, then
// stops it; it returns Run's error if Run ended first.
func runUntilHandled(t *testing.T, e *env, group, topic string, st *pgstore.Store, h pgstore.Handler, handled *atomic.Int64, skip bool) error {
	t.Helper()
	c, err := consumer.New(consumer.Config{Scope: group, Store: st, Handler: h, SkipSchemaCheck: skip,
		CommitEvery: 1, CommitInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, newSpySource(t, group, topic)) }()
	deadline := time.After(60 * time.Second)
	for handled.Load() == 0 {
		select {
		case err := <-done:
			cancel()
			return err
		case <-deadline:
			cancel()
			t.Fatalf("group %s: the handler did not run within 60s (Run: %v)", group, <-done)
		case <-time.After(50 * time.Millisecond):
		}
	}
	cancel()
	return <-done
}
