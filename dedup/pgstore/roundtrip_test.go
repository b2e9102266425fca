package pgstore

// Round trips per message (BEGIN travels with the claim, a reclaimed
// record's success mark with the COMMIT: lazytx.go), a backend killed during
// the pipelined BEGIN and claim, and no pooled connection leaked by any
// outcome. The harness is in env_test.go.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tripConn counts protocol round trips on a client connection, from the
// messages it carries, never from its Read and Write calls (a read that
// pgconn's background reader begins before a slow write ends, or one that
// returns two answers, would miscount them). A round trip begins when the
// client sends a message while the server owes it nothing: every Sync and
// simple Query it sent (and its startup message) has had its ReadyForQuery
// and no flight of messages is half sent (Parse, Bind, Execute… before their
// Sync), or the server waits for the client (CopyInResponse,
// CopyBothResponse, an authentication request). Messages sent while an
// answer is still owed are pipelined: they travel in the round trip already
// under way. A Flush is not
// a sync point: a client that waits after one and then sends is counted
// (nothing is owed), one that goes on sending at once would be counted
// once too often (pgx does not). The connection must be plaintext (the
// pools here use sslmode=disable). Reads (on pgconn's background reader
// too) and writes may run at the same time, hence the mutex.
type tripConn struct {
	net.Conn
	trips *atomic.Int64

	mu          sync.Mutex
	client      pgFramer // client to server; its first message is untyped
	server      pgFramer // server to client
	owed        int      // sync points sent and not yet answered by ReadyForQuery
	unsynced    bool     // messages sent since the last sync point: the flight goes on
	serverWaits bool     // the server's last message asks the client to speak
	err         error    // a framing error: the stream cannot be counted
}

func wrapTrips(c net.Conn, trips *atomic.Int64) net.Conn {
	tc := &tripConn{Conn: c, trips: trips}
	tc.client.untypedFirst = true
	tc.client.onMsg = tc.sent
	tc.server.onMsg = tc.received
	return tc
}

func (c *tripConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.client.feed(b)
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *tripConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	c.server.feed(b[:n])
	if c.err != nil && err == nil {
		err = c.err
	}
	c.mu.Unlock()
	return n, err
}

// sent accounts for one client message (typ 0: the untyped first one,
// whose code is its protocol version or request code).
func (c *tripConn) sent(typ byte, code uint32) {
	if typ == 0 && code != 3<<16 {
		c.err = fmt.Errorf("tripConn: the client's first message has code %d, not protocol 3.0 (an SSL or GSS request?): only plaintext connections can be counted", code)
		return
	}
	if c.serverWaits || (c.owed == 0 && !c.unsynced) {
		c.trips.Add(1)
	}
	c.serverWaits = false
	switch typ {
	case 0, 'S', 'Q': // startup, Sync, simple Query: each is answered by a ReadyForQuery
		c.owed++
		c.unsynced = false
	case 'H', 'p', 'c', 'f':
		// Flush: the client may wait for what it flushed. A password or
		// SASL answer, CopyDone, CopyFail: the ReadyForQuery of the
		// startup or Query they belong to is owed already.
		c.unsynced = false
	default: // Parse, Bind, Execute, Describe, CopyData…: more of the flight follows
		c.unsynced = true
	}
}

// received accounts for one server message (code: an authentication
// request's type, for 'R').
func (c *tripConn) received(typ byte, code uint32) {
	switch typ {
	case 'Z':
		if c.owed == 0 {
			c.err = errors.New("tripConn: ReadyForQuery with no sync point owed")
			return
		}
		c.owed--
		c.serverWaits = false
	case 'G', 'W': // CopyInResponse, CopyBothResponse: the client sends data next
		c.serverWaits = true
	case 'R': // an authentication request other than Ok or SASLFinal awaits the client's answer
		c.serverWaits = code != 0 && code != 12
	}
}

// pgFramer cuts a byte stream into Postgres protocol messages and calls
// onMsg for each, once its header (and for 'R', or an untyped first
// message, the first 4 bytes of its body) has arrived.
type pgFramer struct {
	untypedFirst bool // the next message has no type byte (a startup message)
	onMsg        func(typ byte, code uint32)
	head         []byte // the current message's header bytes so far
	skip         int    // body bytes of the current message still to skip
}

func (f *pgFramer) feed(b []byte) {
	for len(b) > 0 {
		if f.skip > 0 {
			n := min(f.skip, len(b))
			f.skip -= n
			b = b[n:]
			continue
		}
		typed := !f.untypedFirst
		need := 5 // type byte and length
		if !typed {
			need = 8 // length and code
		} else if len(f.head) > 0 && f.head[0] == 'R' {
			need = 9 // type, length and the authentication request type
		}
		n := min(need-len(f.head), len(b))
		f.head = append(f.head, b[:n]...)
		b = b[n:]
		if len(f.head) < need || (typed && need == 5 && f.head[0] == 'R') {
			continue
		}
		var typ byte
		var length, code uint32
		if typed {
			typ = f.head[0]
			length = binary.BigEndian.Uint32(f.head[1:5])
			if typ == 'R' {
				code = binary.BigEndian.Uint32(f.head[5:9])
			}
		} else {
			length = binary.BigEndian.Uint32(f.head[0:4])
			code = binary.BigEndian.Uint32(f.head[4:8])
		}
		f.skip = int(length) - (need - 1)
		if !typed {
			f.skip = int(length) - need
		}
		f.head = f.head[:0]
		f.untypedFirst = false
		f.onMsg(typ, code)
	}
}

// tripStore is a store on a pool of one connection whose round trips are
// counted in trips. The pool never pings on acquire (a ping is a round trip
// of the pool's, not of the store's).
func (e *storeEnv) tripStore(tweak func(*Config)) (*Store, *atomic.Int64) {
	e.t.Helper()
	trips := &atomic.Int64{}
	pool := e.newPool(func(c *pgxpool.Config) {
		c.MaxConns, c.MinConns = 1, 0
		c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		var d net.Dialer
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return wrapTrips(conn, trips), nil
		}
	})
	return e.newStore(pool, tweak), trips
}

// Round trips per message in atomic mode, counted on the wire: a new
// message costs 2 plus the handler's own (BEGIN travels with the claim, the
// COMMIT ends it), a duplicate 2 (the claim's read, then COMMIT, nothing
// written), a retry of a FAILED_RETRYABLE record 3 plus the handler's (the
// reclaim needs the claim's answer; its success mark travels with the
// COMMIT), a handler failure 2 plus the handler's (its mark, and a final
// failure's dead letter, travel with the COMMIT). Lease mode's new claim
// costs 2 (and its completion 1), a start marker of a new identity 2. Each
// count is taken after a warm-up of the same path, so that pgx's statement
// cache is filled (a statement's first use on a connection costs a prepare
// round trip of its own). Before these changes the counts were 3+1, 3,
// 6+1, 5, 6, 3+1 and 3.
func TestRoundTripsPerMessage(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxAttempts = 5 })
	tbl := e.table("rt_items")
	e.exec(`create table ` + tbl + ` (k text primary key)`)
	st, trips := e.tripStore(func(c *Config) { c.MaxAttempts = 5 })
	insert := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		_, err := tx.Exec(ctx, `insert into `+tbl+` (k) values ($1)`, m.Identity.MessageID)
		return err // one round trip: the handler's own
	}
	failOnce := map[string]bool{}
	flaky := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if !failOnce[m.Identity.MessageID] {
			failOnce[m.Identity.MessageID] = true
			return errors.New("first attempt fails")
		}
		return insert(ctx, tx, m)
	}
	failing := func(context.Context, pgx.Tx, *dedup.Message) error { return errors.New("fails") }
	permanent := func(context.Context, pgx.Tx, *dedup.Message) error { return dedup.Permanent(errors.New("never")) }
	const handlerTrips = 1
	warm := true
	count := func(what string, want int64, f func()) {
		t.Helper()
		before := trips.Load()
		f()
		if got := trips.Load() - before; !warm && got != want {
			t.Errorf("%s: %d round trips, want %d", what, got, want)
		}
	}
	process := func(id string, h Handler, want dedup.Outcome) {
		t.Helper()
		res, err := st.Process(e.ctx, e.msg(id, "", "p"), h)
		if err != nil || res.Outcome != want {
			t.Fatalf("%s: %+v, %v; want %s", id, res, err, want)
		}
	}
	for i := range 2 { // i 0 warms the statement cache, i 1 counts
		n := fmt.Sprint(i)
		count("new message "+n, 2+handlerTrips, func() { process("new-"+n, insert, dedup.OutcomeProcessed) })
		count("duplicate "+n, 2, func() { process("new-"+n, insert, dedup.OutcomeDuplicate) })
		process("retry-"+n, flaky, dedup.OutcomeRetry) // FAILED_RETRYABLE, attempts 1
		count("retry "+n, 3+handlerTrips, func() { process("retry-"+n, flaky, dedup.OutcomeProcessed) })
		count("handler failure "+n, 2, func() { process("fail-"+n, failing, dedup.OutcomeRetry) })
		count("permanent failure "+n, 2, func() { process("perm-"+n, permanent, dedup.OutcomeDeadLetter) })
		count("lease claim and completion "+n, 2+1, func() {
			res, err := st.ProcessLeased(e.ctx, e.msg("lease-"+n, "", "p"), func(context.Context, *dedup.Message) error { return nil },
				dedup.LeaseOptions{TTL: time.Minute})
			if err != nil || res.Outcome != dedup.OutcomeProcessed {
				t.Fatalf("lease: %+v, %v", res, err)
			}
		})
		count("start marker of a new identity "+n, 2, func() {
			if m, err := st.MarkStart(e.ctx, e.msg("mark-"+n, "", "p")); err != nil || !m.Run {
				t.Fatalf("MarkStart: %+v, %v", m, err)
			}
		})
		warm = false
	}
	if got := e.count(`select count(*) from ` + tbl); got != 4 {
		t.Fatalf("rows = %d, want 4 (new-0, new-1, retry-0, retry-1)", got)
	}
}

// A backend killed while the pipelined BEGIN and claim are on the wire
// (the claim waits for the row lock of a FAILED_RETRYABLE record that
// another transaction holds), or already dead when they are sent (an idle
// pooled connection terminated): nothing could have committed, the handler
// does not run, and the error classifies as a lost connection before COMMIT
// always did (dedup.FailureOutcomeUnknown: not the handler's failure,
// nothing counted or marked, not acked). The connection goes back to the
// pool (which drops it), and the next copy runs at attempt 2.
func TestBackendKilledDuringPipelinedBegin(t *testing.T) {
	t.Parallel()
	for _, when := range []string{"claim waiting", "idle before begin"} {
		t.Run(when, func(t *testing.T) {
			e := newEnv(t, nil)
			tbl := e.table("kill_items")
			e.exec(`create table ` + tbl + ` (k text primary key)`)
			one := e.newPool(func(c *pgxpool.Config) {
				c.MaxConns, c.MinConns = 1, 0
				c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
			})
			st := e.newStore(one, nil)
			var calls atomic.Int64
			insert := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
				calls.Add(1)
				_, err := tx.Exec(ctx, `insert into `+tbl+` (k) values ($1)`, m.Identity.MessageID)
				return err
			}
			fail := func(context.Context, pgx.Tx, *dedup.Message) error { return errors.New("first attempt fails") }
			if res, err := st.Process(e.ctx, e.msg("m-k", "", "p"), fail); err != nil || res.Status != dedup.StatusFailedRetryable {
				t.Fatalf("first copy: %+v, %v; want FAILED_RETRYABLE", res, err)
			}
			var pid uint32
			if err := one.AcquireFunc(e.ctx, func(c *pgxpool.Conn) error { pid = c.Conn().PgConn().PID(); return nil }); err != nil {
				t.Fatal(err)
			}
			terminate := func() {
				var ok bool
				if err := e.pool.QueryRow(e.ctx, `select pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
					t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, ok, err)
				}
			}
			var res dedup.Result
			var err error
			if when == "idle before begin" {
				terminate()
				// Wait until the backend is gone, so that the batch meets a
				// dead connection.
				waitFor(t, e, `select count(*) = 0 from pg_stat_activity where pid = $1`, pid)
				res, err = st.Process(e.ctx, e.msg("m-k", "", "p"), insert)
			} else {
				lock, lerr := e.pool.Begin(e.ctx)
				if lerr != nil {
					t.Fatal(lerr)
				}
				defer func() { _ = lock.Rollback(context.WithoutCancel(e.ctx)) }()
				if _, lerr := lock.Exec(e.ctx, `select id from `+e.records()+` where scope = $1 and message_id = 'm-k' for update`, e.scope); lerr != nil {
					t.Fatal(lerr)
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					res, err = st.Process(e.ctx, e.msg("m-k", "", "p"), insert)
				}()
				// The store's backend is inside the transaction its
				// pipelined BEGIN opened, waiting for the record's lock.
				waitFor(t, e, `select count(*) = 1 from pg_stat_activity where pid = $1 and wait_event_type = 'Lock' and xact_start is not null`, pid)
				terminate()
				<-done
				_ = lock.Rollback(e.ctx)
			}
			if err == nil || !dedup.IsOutcomeUnknown(err) || res.HandlerCalled || res.Outcome != "" || calls.Load() != 0 {
				t.Fatalf("killed copy: %+v, %v (handler calls %d); want a lost-connection error (FailureOutcomeUnknown), handler not called", res, err, calls.Load())
			}
			waitReleased(t, one)
			if r := e.record("m-k"); r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 {
				t.Fatalf("record after the kill: %+v; want FAILED_RETRYABLE at 1 attempt (nothing counted)", r)
			}
			res, err = st.Process(e.ctx, e.msg("m-k", "", "p"), insert)
			if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 2 || calls.Load() != 1 {
				t.Fatalf("next copy: %+v, %v (handler calls %d); want processed at attempt 2, one call", res, err, calls.Load())
			}
		})
	}
}

// waitFor polls the boolean query (with args) until it answers true, for at
// most a minute.
func waitFor(t *testing.T, e *storeEnv, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var ok bool
		if err := e.pool.QueryRow(e.ctx, query, args...).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still false after a minute: %s", query)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitReleased waits until no connection of pool is acquired, for at most a
// minute: the pool destroys a released broken connection asynchronously,
// and counts it as acquired until then.
func waitReleased(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for pool.Stat().AcquiredConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d pooled connections still acquired after a minute, want 0 (a connection leaked)", pool.Stat().AcquiredConns())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// 1,000 deliveries with every outcome (new, duplicate, handler error,
// panic, permanent error, a handler that leaves the transaction aborted on
// a new and on a reclaimed record, conflicts, lease mode with success and
// failure, start markers) through 3 workers on a pool of 3 connections: at
// the end no connection is still acquired. A leaked connection would also
// starve the pool: every call has a 30 s deadline.
func TestNoPooledConnectionLeaks(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxAttempts = 3 })
	tbl := e.table("leak_items")
	e.exec(`create table ` + tbl + ` (k text primary key)`)
	pool := e.newPool(func(c *pgxpool.Config) { c.MaxConns, c.MinConns = 3, 0 })
	st := e.newStore(pool, func(c *Config) { c.MaxAttempts = 3 })
	insert := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		_, err := tx.Exec(ctx, `insert into `+tbl+` (k) values ($1)`, m.Identity.MessageID)
		return err
	}
	swallow := func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
		_, _ = tx.Exec(ctx, `select 1/0`) // aborts the transaction; error ignored
		return nil
	}
	handlers := []Handler{
		insert,
		func(context.Context, pgx.Tx, *dedup.Message) error { return errors.New("retryable") },
		func(context.Context, pgx.Tx, *dedup.Message) error { panic("boom") },
		func(context.Context, pgx.Tx, *dedup.Message) error { return dedup.Permanent(errors.New("permanent")) },
		swallow,
	}
	const n, workers = 1000, 3
	outcomes := map[dedup.Outcome]int{}
	var mu sync.Mutex
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range work {
				ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
				id := fmt.Sprintf("m-%d", i%250) // each identity comes back 4 times
				payload := "p"
				if i%17 == 0 {
					payload = "other" // a conflict once the identity has a record
				}
				var res dedup.Result
				var err error
				switch i % 7 {
				case 5:
					res, err = st.ProcessLeased(ctx, e.msg("lease-"+id, "", payload), func(context.Context, *dedup.Message) error {
						if i%2 == 0 {
							return errors.New("lease handler fails")
						}
						return nil
					}, dedup.LeaseOptions{TTL: time.Minute})
				case 6:
					var m dedup.StartMark
					if m, err = st.MarkStart(ctx, e.msg(id, "", payload)); err == nil && m.Run {
						res, err = st.Process(ctx, e.msg(id, "", payload), handlers[i%len(handlers)])
					}
				default:
					res, err = st.Process(ctx, e.msg(id, "", payload), handlers[i%len(handlers)])
				}
				cancel()
				if err != nil && !errors.Is(err, dedup.ErrLeaseHeld) {
					t.Errorf("delivery %d (%s): %v", i, id, err)
				}
				mu.Lock()
				outcomes[res.Outcome]++
				mu.Unlock()
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	t.Logf("outcomes: %v", outcomes)
	for _, o := range []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDuplicate, dedup.OutcomeRetry, dedup.OutcomeDeadLetter, dedup.OutcomeConflict} {
		if outcomes[o] == 0 {
			t.Errorf("no %s outcome among %d deliveries: the mix does not cover it", o, n)
		}
	}
	waitReleased(t, pool)
}

// A success mark that travels with the COMMIT and fails makes the server
// skip the COMMIT: the handler's writes never commit without their record
// SUCCEEDED. The handler on a reclaimed (FAILED_RETRYABLE) record either
// leaves its transaction aborted (it swallowed an error), or changes the
// record itself so that the mark finds no PROCESSING record (the mark then
// raises, instead of answering "0 rows"). Either way it is the handler's
// failure, marked in the same transaction after its savepoint: counted, its
// writes rolled back; the next copy runs at the next attempt.
func TestMarkAtCommitRefused(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"aborted", "record changed"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t, nil)
			tbl := e.table("mark_items")
			e.exec(`create table ` + tbl + ` (k text primary key)`)
			insert := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
				_, err := tx.Exec(ctx, `insert into `+tbl+` (k) values ($1)`, m.Identity.MessageID)
				return err
			}
			spoil := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
				if err := insert(ctx, tx, m); err != nil {
					return err
				}
				if how == "aborted" {
					_, _ = tx.Exec(ctx, `select 1/0`) // error swallowed: the transaction is aborted
					return nil
				}
				_, err := tx.Exec(ctx, `update `+e.records()+` set status = 'FAILED_RETRYABLE' where scope = $1 and message_id = $2`,
					e.scope, m.Identity.MessageID)
				return err
			}
			fail := func(context.Context, pgx.Tx, *dedup.Message) error { return errors.New("first attempt fails") }
			if res, err := e.store.Process(e.ctx, e.msg("m-1", "", "p"), fail); err != nil || res.Outcome != dedup.OutcomeRetry {
				t.Fatalf("first copy: %+v, %v", res, err)
			}
			res, err := e.store.Process(e.ctx, e.msg("m-1", "", "p"), spoil)
			if err != nil || res.Outcome != dedup.OutcomeRetry || res.Attempts != 2 || !res.HandlerCalled {
				t.Fatalf("second copy: %+v, %v; want a counted retry at attempt 2 (the mark refused)", res, err)
			}
			if r := e.record("m-1"); r.Status != dedup.StatusFailedRetryable || r.Attempts != 2 {
				t.Fatalf("record = %+v; want FAILED_RETRYABLE at 2 attempts", r)
			}
			if n := e.count(`select count(*) from ` + tbl); n != 0 {
				t.Fatalf("%d business rows committed without a SUCCEEDED record, want 0", n)
			}
			res, err = e.store.Process(e.ctx, e.msg("m-1", "", "p"), insert)
			if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 3 {
				t.Fatalf("third copy: %+v, %v; want processed at attempt 3", res, err)
			}
			if n := e.count(`select count(*) from ` + tbl); n != 1 {
				t.Fatalf("%d business rows, want 1", n)
			}
		})
	}
}

// The handler cannot tell the transaction whose BEGIN travelled with the
// claim from pgx's own: every pgx.Tx method works inside it (a nested
// transaction, a query, a batch, COPY, a prepared statement, large objects,
// the connection, inside a transaction block), and its writes commit with
// the record. A lazyTx on which a statement other than a batch comes first
// begins at once, one that sent nothing commits and rolls back without a
// word to the server, and every one gives its connection back.
func TestLazyTxIsAnOrdinaryTx(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("lazy_items")
	e.exec(`create table ` + tbl + ` (k text primary key)`)
	pool := e.newPool(func(c *pgxpool.Config) { c.MaxConns, c.MinConns = 2, 0 })
	st := e.newStore(pool, nil)
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if st := tx.Conn().PgConn().TxStatus(); st != 'T' {
			return fmt.Errorf("transaction status %q, want T", st)
		}
		nested, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := nested.Exec(ctx, `insert into `+tbl+` (k) values ($1)`, m.Identity.MessageID+"-nested-rolled-back"); err != nil {
			return err
		}
		if err := nested.Rollback(ctx); err != nil {
			return err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{e.biz, "lazy_items"}, []string{"k"}, pgx.CopyFromRows([][]any{{m.Identity.MessageID + "-copy"}})); err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`insert into `+tbl+` (k) values ($1)`, m.Identity.MessageID+"-batch")
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if _, err := tx.Prepare(ctx, "lazy_insert", `insert into `+tbl+` (k) values ($1)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "lazy_insert", m.Identity.MessageID+"-prepared"); err != nil {
			return err
		}
		lo := tx.LargeObjects()
		oid, err := lo.Create(ctx, 0)
		if err != nil {
			return err
		}
		if err := lo.Unlink(ctx, oid); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `select k from `+tbl+` order by k`)
		if err != nil {
			return err
		}
		ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(ks) != 3 {
			return fmt.Errorf("rows seen in the transaction: %v, want 3", ks)
		}
		return nil
	}
	if res, err := st.Process(e.ctx, e.msg("m-1", "", "p"), h); err != nil || res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("Process: %+v, %v", res, err)
	}
	if n := e.count(`select count(*) from ` + tbl); n != 3 {
		t.Fatalf("%d rows committed, want 3 (copy, batch, prepared)", n)
	}

	// Direct use: nothing sent, a statement first, and closed twice.
	idle, err := beginLazy(e.ctx, pool, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Commit(e.ctx); err != nil {
		t.Fatalf("commit of a transaction that sent nothing: %v", err)
	}
	if err := idle.Rollback(e.ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("rollback after commit: %v, want ErrTxClosed", err)
	}
	eager, err := beginLazy(e.ctx, pool, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	var iso string
	if err := eager.QueryRow(e.ctx, `select current_setting('transaction_isolation')`).Scan(&iso); err != nil || iso != "serializable" {
		t.Fatalf("isolation inside a lazyTx begun by a query: %q, %v; want serializable", iso, err)
	}
	if err := eager.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := eager.Exec(e.ctx, `select 1`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("exec after rollback: %v, want ErrTxClosed", err)
	}
	waitReleased(t, pool)
}
