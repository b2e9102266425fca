package httpidem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// S21: 20 identical requests at once run the handler once: exactly one
// 201, every other copy 409 with a problem body and Retry-After (never a
// 5xx), and a later retry gets the same 201 body byte for byte, marked
// as a replay. The handler holds its transaction until all 19 copies were
// answered, so the test depends on no timing.
func TestS21SameKeyAtTheSameTime(t *testing.T) {
	metrics := NewMetrics(nil)
	e := newEnv(t, func(c *Config) { c.Metrics = metrics })
	const copies = 20
	body := `{"amount":"30.00","currency":"EUR","ref":"inv-1"}`
	othersDone := make(chan struct{})
	e.before = func(*http.Request, int) int {
		select {
		case <-othersDone:
		case <-time.After(time.Minute):
		}
		return 0
	}
	var wg sync.WaitGroup
	results := make([]resp, copies)
	var answered sync.WaitGroup
	answered.Add(copies - 1)
	for i := range copies {
		wg.Go(func() {
			results[i] = e.post("/payments", "alice", "K1", body)
			if results[i].status != http.StatusCreated {
				answered.Done() // the executing copy returns only after othersDone
			}
		})
	}
	answered.Wait()
	close(othersDone)
	wg.Wait()

	var created []resp
	for i, r := range results {
		switch r.status {
		case http.StatusCreated:
			created = append(created, r)
		case http.StatusConflict:
			p := r.problem(t)
			if p.Type != TypeInFlight {
				t.Fatalf("copy %d: problem type %q, want %q", i, p.Type, TypeInFlight)
			}
			if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
				t.Fatalf("copy %d: Retry-After %q", i, r.header.Get("Retry-After"))
			}
		default:
			t.Fatalf("copy %d: status %d %s, want 201 or 409", i, r.status, r.body)
		}
	}
	if len(created) != 1 || created[0].replayed() {
		t.Fatalf("%d responses 201 (first replayed: %v), want exactly one executed", len(created), len(created) > 0 && created[0].replayed())
	}
	mustEqual(t, "handler calls", e.calls.Load(), 1)
	mustEqual(t, "payments rows", e.payments(), 1)

	later := e.post("/payments", "alice", "K1", body)
	if later.status != http.StatusCreated || !later.replayed() || !bodyEqual(later.body, created[0].body) {
		t.Fatalf("later retry: %d replayed=%v body %s, want 201 replay of %s", later.status, later.replayed(), later.body, created[0].body)
	}
	for _, h := range []string{"Location", ResourceIDHeader, "Content-Type"} {
		if later.header.Get(h) != created[0].header.Get(h) {
			t.Fatalf("replayed %s %q, want %q", h, later.header.Get(h), created[0].header.Get(h))
		}
	}
	if later.header.Get("X-Not-Stored") != "" {
		t.Fatal("a header outside StoredHeaders was replayed")
	}
	status, attempts := e.record("alice", "POST /payments", "K1")
	mustEqual(t, "record", status+"/"+strconv.Itoa(attempts), "SUCCEEDED/1")
	mustEqual(t, "handler calls", e.calls.Load(), 1)
	for o, want := range map[Outcome]uint64{OutcomeExecuted: 1, OutcomeInFlight: copies - 1, OutcomeReplayed: 1, OutcomeConflict: 0} {
		mustEqual(t, "metric "+string(o), metrics.Count(o), want)
	}
}

// S21 with InFlightWait: a copy that waits longer than the first request
// takes gets the replay, not a 409.
func TestInFlightWaitAnswersFromTheFirstOutcome(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.InFlightWait = 30 * time.Second })
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	e.before = func(*http.Request, int) int {
		started <- struct{}{}
		<-release
		return 0
	}
	body := `{"amount":"30.00"}`
	first := make(chan resp, 1)
	go func() { first <- e.post("/payments", "alice", "K1", body) }()
	<-started
	second := make(chan resp, 1)
	go func() { second <- e.post("/payments", "alice", "K1", body) }()
	// The second request waits on the first's key lock (a lock wait in
	// Postgres) until the first commits.
	e.waitForLockWaiter()
	close(release)
	a, b := <-first, <-second
	if a.status != http.StatusCreated || b.status != http.StatusCreated || !b.replayed() || !bodyEqual(a.body, b.body) {
		t.Fatalf("first %d %s, second %d replayed=%v %s", a.status, a.body, b.status, b.replayed(), b.body)
	}
	mustEqual(t, "handler calls", e.calls.Load(), 1)
}

// waitForLockWaiter waits until a transaction waits on the advisory lock
// of alice's K1 on POST /payments (the second request).
func (e *env) waitForLockWaiter() {
	e.t.Helper()
	sum := sha256.Sum256([]byte(dbSchema + ".consumption_records\x00" + Scope(e.tenant, "alice", http.MethodPost, "POST /payments") + "\x00K1"))
	key := int64(binary.BigEndian.Uint64(sum[:8])) //nolint:gosec // the store's key: a hash, wrapping intended
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if e.count(`select count(*) from pg_locks where locktype = 'advisory' and not granted and objsubid = 1
  and ((classid::bigint << 32) | objid::bigint) = $1`, key) > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatal("no request waited on the key's lock")
}

// S22: the same key with a different request is refused (422, or 409 when
// configured) with a problem body and the handler not called; keys are per
// route; a re-serialized body is a replay; the first request again is a
// replay.
func TestS22SameKeyDifferentRequest(t *testing.T) {
	for _, conflictStatus := range []int{0, http.StatusConflict} {
		t.Run(strconv.Itoa(conflictStatus), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.ConflictStatus = conflictStatus })
			want := http.StatusUnprocessableEntity
			if conflictStatus != 0 {
				want = conflictStatus
			}
			first := e.post("/payments", "alice", "K2", `{"amount":"30.00","currency":"EUR"}`)
			if first.status != http.StatusCreated {
				t.Fatalf("first: %d %s", first.status, first.body)
			}
			// (a) same route and key, another amount.
			a := e.post("/payments", "alice", "K2", `{"amount":"45.00","currency":"EUR"}`)
			if a.status != want || a.problem(t).Type != TypeKeyReused {
				t.Fatalf("(a): %d %s, want %d %s", a.status, a.body, want, TypeKeyReused)
			}
			mustEqual(t, "handler calls after (a)", e.calls.Load(), 1)
			status, attempts := e.record("alice", "POST /payments", "K2")
			mustEqual(t, "record after (a)", status+"/"+strconv.Itoa(attempts), "SUCCEEDED/1")
			// (b) another route, same key: keys are per route (the route is
			// part of the scope), so this is a request of its own.
			b := e.post("/refunds", "alice", "K2", `{"amount":"30.00","currency":"EUR"}`)
			if b.status != http.StatusCreated || b.replayed() {
				t.Fatalf("(b): %d replayed=%v %s, want a new 201 (keys are per route)", b.status, b.replayed(), b.body)
			}
			// (c) the first body with other white space and member order.
			c := e.post("/payments", "alice", "K2", "{ \"currency\" : \"EUR\",\n  \"amount\":\"30.00\" }")
			if c.status != http.StatusCreated || !c.replayed() || !bodyEqual(c.body, first.body) {
				t.Fatalf("(c): %d replayed=%v %s, want the replay of %s", c.status, c.replayed(), c.body, first.body)
			}
			// (d) the first request again.
			d := e.post("/payments", "alice", "K2", `{"amount":"30.00","currency":"EUR"}`)
			if d.status != http.StatusCreated || !d.replayed() || !bodyEqual(d.body, first.body) {
				t.Fatalf("(d): %d replayed=%v %s", d.status, d.replayed(), d.body)
			}
			mustEqual(t, "handler calls", e.calls.Load(), 1)
			mustEqual(t, "payments rows", e.payments(), 1)
			mustEqual(t, "dead letters of (a)", e.count(`select count(*) from `+quoted(dbSchema, "dead_letters")+` where scope = $1 and message_id = 'K2' and reason = 'payload_conflict'`,
				Scope(e.tenant, "alice", http.MethodPost, "POST /payments")), 1)
		})
	}
}

// Keys of two principals never collide: the same key by alice and bob is
// two requests, each replayed to its own principal only.
func TestKeysOfTwoPrincipalsNeverCollide(t *testing.T) {
	e := newEnv(t, nil)
	a := e.post("/payments", "alice", "K", `{"amount":"1.00"}`)
	b := e.post("/payments", "bob", "K", `{"amount":"2.00"}`)
	if a.status != http.StatusCreated || b.status != http.StatusCreated || a.replayed() || b.replayed() {
		t.Fatalf("alice %d %s, bob %d %s", a.status, a.body, b.status, b.body)
	}
	a2 := e.post("/payments", "alice", "K", `{"amount":"1.00"}`)
	b2 := e.post("/payments", "bob", "K", `{"amount":"2.00"}`)
	if !bodyEqual(a2.body, a.body) || !bodyEqual(b2.body, b.body) || !a2.replayed() || !b2.replayed() {
		t.Fatalf("replays crossed: alice %s / %s, bob %s / %s", a.body, a2.body, b.body, b2.body)
	}
	mustEqual(t, "payments rows", e.payments(), 2)
	// Injective scopes: separators inside parts do not make two identities one.
	if Scope("a|b", "c", "POST", "/x") == Scope("a", "b|c", "POST", "/x") {
		t.Fatal("scopes collide across the separator")
	}
}

// A client that hangs up after the handler's writes loses only the
// response: the record commits (detached context), and the retry replays.
func TestReplayAfterTheResponseWasLost(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(e.ctx)
	wrote := make(chan struct{})
	proceed := make(chan struct{})
	e.after = func(*http.Request) {
		close(wrote)
		<-proceed
	}
	errc := make(chan error, 1)
	go func() {
		_, err := e.send(ctx, "/payments", "alice", "K3", `{"amount":"30.00"}`, nil)
		errc <- err
	}()
	<-wrote
	cancel() // the client hangs up mid-handler, after the side effect
	if err := <-errc; err == nil {
		t.Fatal("the cancelled request got a response")
	}
	close(proceed)
	e.waitRecord("alice", "POST /payments", "K3", "SUCCEEDED")
	r := e.post("/payments", "alice", "K3", `{"amount":"30.00"}`)
	if r.status != http.StatusCreated || !r.replayed() {
		t.Fatalf("retry: %d replayed=%v %s", r.status, r.replayed(), r.body)
	}
	mustEqual(t, "handler calls", e.calls.Load(), 1)
	mustEqual(t, "payments rows", e.payments(), 1)
}

func (e *env) waitRecord(user, route, key, want string) {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if st, _ := e.record(user, route, key); st == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, n := e.record(user, route, key)
	e.t.Fatalf("record %s: %q (%d attempts), want %s", key, st, n, want)
}

func quoted(schema, table string) string { return `"` + schema + `"."` + table + `"` }

// Asynchronous routes answer a copy of a running request 202 with the
// status URL instead of 409; replays are unchanged.
func TestAsyncStatusAnswersCopiesWith202(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.AsyncStatus = func(_ *http.Request, info Info) string { return "/operations/" + info.DownstreamKey() }
	})
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	e.before = func(*http.Request, int) int {
		started <- struct{}{}
		<-release
		return 0
	}
	first := make(chan resp, 1)
	go func() { first <- e.post("/payments", "alice", "KA", `{"amount":"1"}`) }()
	<-started
	c := e.post("/payments", "alice", "KA", `{"amount":"1"}`)
	want := "/operations/" + Info{Scope: Scope(e.tenant, "alice", http.MethodPost, "POST /payments"), Key: "KA"}.DownstreamKey()
	if c.status != http.StatusAccepted || c.header.Get("Location") != want || c.header.Get("Retry-After") == "" || len(c.body) != 0 {
		t.Fatalf("copy: %d Location %q Retry-After %q %s", c.status, c.header.Get("Location"), c.header.Get("Retry-After"), c.body)
	}
	close(release)
	if a := <-first; a.status != http.StatusCreated {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	if r := e.post("/payments", "alice", "KA", `{"amount":"1"}`); r.status != http.StatusCreated || !r.replayed() {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	mustEqual(t, "handler calls", e.calls.Load(), 1)
}
