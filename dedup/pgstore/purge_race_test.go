package pgstore

// A purge meets a live read (S27), forced: readRaceHook runs the real
// purge (Store.PurgeRecords, on another connection of the pool, committed)
// between a read path's read of a record and its next statement. The
// integration module runs the same race unforced, through the middleware,
// many copies at once (integration/purge_race_test.go).

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// raceHooks are the armed hooks by scope: readRaceHook dispatches to the
// one of the record's scope, so that parallel tests each purge at their own
// point only.
var (
	raceHooks       sync.Map // scope → func(point string)
	raceHookInstall sync.Once
)

// purgeAt arms readRaceHook: the first time point is reached for a record
// of e's scope, every expired record of e's schema is purged (the real
// purge, committed on another connection), and the purge must delete
// exactly one. It returns how many times the purge ran; the hook is
// disarmed when the test ends.
func (e *storeEnv) purgeAt(point string) *atomic.Int64 {
	e.t.Helper()
	raceHookInstall.Do(func() {
		h := func(p string, id dedup.Identity) {
			if f, ok := raceHooks.Load(id.Scope); ok {
				f.(func(string))(p)
			}
		}
		readRaceHook.Store(&h)
	})
	var ran atomic.Int64
	raceHooks.Store(e.scope, func(p string) {
		if p != point || ran.Load() > 0 {
			return
		}
		ran.Add(1)
		n, err := e.store.PurgeRecords(context.WithoutCancel(e.ctx), PurgeOptions{})
		if err != nil || n != 1 {
			e.t.Errorf("purge at %q: deleted %d, %v; want 1", point, n, err)
		}
	})
	e.t.Cleanup(func() { raceHooks.Delete(e.scope) })
	return &ran
}

// httpTransfer is an HTTP request of e's scope with key, whose handler
// inserts a transfer row and answers 201, counting its executions.
type httpTransfer struct {
	e     *storeEnv
	hs    *HTTPStore
	calls atomic.Int64
}

func newHTTPTransfer(e *storeEnv) *httpTransfer {
	e.t.Helper()
	hs, err := NewHTTPStore(e.store)
	if err != nil {
		e.t.Fatal(err)
	}
	e.exec(`create table ` + e.table("transfers") + ` (id bigint generated always as identity, key text not null)`)
	return &httpTransfer{e: e, hs: hs}
}

func (h *httpTransfer) post(key string) (HTTPResult, error) {
	e := h.e
	payload := []byte(`{"from":"a","to":"b","amount":"10.00"}`)
	fp := e.store.fp
	sum, keyID, err := fp.Sum(payload)
	if err != nil {
		e.t.Fatal(err)
	}
	msg := &dedup.Message{Identity: dedup.Identity{Scope: e.scope, MessageID: key}, Payload: payload, Topic: "POST /transfers"}
	req := HTTPRequest{Message: msg, Principal: "alice", Sum: sum, KeyID: keyID, CanonVersion: 1,
		Matches: func(_ int, stored []byte, storedKeyID string) (bool, error) {
			return fp.Matches(payload, stored, storedKeyID)
		},
		MaxUnfinished: 10, UnfinishedWindow: time.Hour}
	return h.hs.Process(e.ctx, req, func(ctx context.Context, tx pgx.Tx, _ int) (HTTPResponse, error) {
		h.calls.Add(1)
		if _, err := tx.Exec(ctx, `insert into `+e.table("transfers")+` (key) values ($1)`, key); err != nil {
			return HTTPResponse{}, err
		}
		return HTTPResponse{Status: 201, Stored: []byte("transfer tr-27")}, nil
	})
}

// expire moves the expiry of e's records 1 s into the past (S27).
func (e *storeEnv) expire() {
	e.exec(`update `+e.records()+` set expires_at = now() - interval '1 second' where scope = $1`, e.scope)
}

// A retry of an expired key whose record the purge deletes between the
// claim's read (SUCCEEDED) and the read of its stored response: the copy
// must not fail ("no stored response": a 503) but run as new, once; the
// next copy replays it.
func TestHTTPPurgeBetweenClaimAndStoredRead(t *testing.T) {
	e := newOwnSchemaEnv(t, nil)
	h := newHTTPTransfer(e)
	if r, err := h.post("tr-27"); err != nil || r.Outcome != HTTPExecuted {
		t.Fatalf("first request: %s, %v", r.Outcome, err)
	}
	e.expire()
	ran := e.purgeAt("http claimed")
	r, err := h.post("tr-27")
	if ran.Load() != 1 {
		t.Fatalf("the purge ran %d times between the claim and the read, want 1", ran.Load())
	}
	if err != nil {
		t.Fatalf("retry met by the purge: %v (answered 503), want it run as new", err)
	}
	if r.Outcome != HTTPExecuted || r.Response.Status != 201 {
		t.Fatalf("retry met by the purge: %s %d, want executed 201", r.Outcome, r.Response.Status)
	}
	r, err = h.post("tr-27")
	if err != nil || r.Outcome != HTTPReplayed || r.Response.Status != 201 || string(r.Response.Stored) != "transfer tr-27" {
		t.Fatalf("copy after it: %s %d %q, %v; want its replay", r.Outcome, r.Response.Status, r.Response.Stored, err)
	}
	rows := e.count(`select count(*) from ` + e.table("transfers"))
	if got := h.calls.Load(); got != 2 || rows != 2 {
		t.Fatalf("executions %d, transfer rows %d; want 2 and 2 (the first, and one after the purge)", got, rows)
	}
	if n := e.count(`select count(*) from `+e.records()+` where scope = $1`, e.scope); n != 1 {
		t.Fatalf("%d records of tr-27, want 1", n)
	}
}

// Inspect (`idemq inspect`) while the purge deletes the record: it shows
// the record with its stored part as one snapshot had them, or nothing
// (ErrNotFound), never a SUCCEEDED record without the response it holds.
func TestHTTPInspectPurgeBetweenReads(t *testing.T) {
	e := newOwnSchemaEnv(t, nil)
	h := newHTTPTransfer(e)
	if r, err := h.post("tr-27"); err != nil || r.Outcome != HTTPExecuted {
		t.Fatalf("first request: %s, %v", r.Outcome, err)
	}
	e.expire()
	ran := e.purgeAt("http inspect")
	id := dedup.Identity{Scope: e.scope, MessageID: "tr-27"}
	in, err := h.hs.Inspect(e.ctx, id)
	if ran.Load() != 1 {
		t.Fatalf("the purge ran %d times during inspect, want 1", ran.Load())
	}
	switch {
	case errors.Is(err, dedup.ErrNotFound):
	case err != nil:
		t.Fatalf("inspect met by the purge: %v", err)
	case in.Stored == nil:
		t.Fatalf("inspect met by the purge: record %s without its stored part (the record from before the purge, its response from after)", in.Record.Status)
	case in.Record.Status != dedup.StatusSucceeded || in.Stored.Response.Status != 201:
		t.Fatalf("inspect met by the purge: record %s, stored status %d; want SUCCEEDED, 201", in.Record.Status, in.Stored.Response.Status)
	}
	if _, err := h.hs.Inspect(e.ctx, id); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("inspect after the purge: %v, want ErrNotFound", err)
	}
}
