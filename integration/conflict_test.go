package integration

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/jackc/pgx/v5"
)

// processor runs one delivery in one mode of one store, for the store-level
// tests below.
type processor struct {
	name    string
	process func(t *testing.T, m *dedup.Message) dedup.Result
	reject  func(t *testing.T, m *dedup.Message) dedup.Result
	redrive func(t *testing.T, scope, messageID string)
	lookup  lookuper
	deadLet func(t *testing.T, scope string) []dedup.DeadLetter
}

// processors returns the four modes, each on a fresh store; calls counts
// the handler's calls. fp, when not nil, replaces the test fingerprinter.
func processors(t *testing.T, calls *callCounter, fp *dedup.Fingerprinter) []processor {
	t.Helper()
	h := func(_ context.Context, _ pgx.Tx, m *dedup.Message) error { calls.add(m.Identity.MessageID); return nil }
	lh := func(_ context.Context, m *dedup.Message) error { calls.add(m.Identity.MessageID); return nil }
	tweak := func(c *pgstore.Config) {
		if fp != nil {
			c.Fingerprinter = fp
		}
	}
	pg := func(name string, run func(e *env, m *dedup.Message) (dedup.Result, error)) processor {
		e := setup(t, tweak)
		return processor{name: name, lookup: e.store,
			process: func(t *testing.T, m *dedup.Message) dedup.Result {
				t.Helper()
				res, err := run(e, m)
				if err != nil {
					t.Fatal(err)
				}
				return res
			},
			reject: func(t *testing.T, m *dedup.Message) dedup.Result {
				t.Helper()
				res, err := e.store.Reject(e.ctx, m, dedup.ReasonBadInput, errors.New("business key: no order ID"))
				if err != nil {
					t.Fatal(err)
				}
				return res
			},
			redrive: func(t *testing.T, scope, mid string) {
				t.Helper()
				if err := e.store.Redrive(e.ctx, scope, mid); err != nil {
					t.Fatal(err)
				}
			},
			deadLet: func(_ *testing.T, scope string) []dedup.DeadLetter { return e.deadLetters(scope) },
		}
	}
	rs := newRedisStore(t, func(c *redisstore.Config) {
		if fp != nil {
			c.Fingerprinter = fp
		}
	})
	ctx := context.Background()
	return []processor{
		pg("atomic", func(e *env, m *dedup.Message) (dedup.Result, error) { return e.store.Process(e.ctx, m, h) }),
		pg("batched", func(e *env, m *dedup.Message) (dedup.Result, error) {
			res, err := e.store.ProcessBatch(e.ctx, []*dedup.Message{m}, h)
			if err != nil {
				return dedup.Result{}, err
			}
			return res[0], nil
		}),
		pg("lease", func(e *env, m *dedup.Message) (dedup.Result, error) {
			return e.store.ProcessLeased(e.ctx, m, lh, dedup.LeaseOptions{})
		}),
		{name: "redis-only", lookup: rs,
			process: func(t *testing.T, m *dedup.Message) dedup.Result {
				t.Helper()
				res, err := rs.ProcessLeased(ctx, m, lh, dedup.LeaseOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return res
			},
			reject: func(t *testing.T, m *dedup.Message) dedup.Result {
				t.Helper()
				res, err := rs.Reject(ctx, m, dedup.ReasonBadInput, errors.New("business key: no order ID"))
				if err != nil {
					t.Fatal(err)
				}
				return res
			},
			redrive: func(t *testing.T, scope, mid string) {
				t.Helper()
				if err := rs.Redrive(ctx, scope, mid); err != nil {
					t.Fatal(err)
				}
			},
			deadLet: func(t *testing.T, scope string) []dedup.DeadLetter {
				t.Helper()
				dls, err := rs.DeadLetters(ctx, scope, 0, 100)
				if err != nil {
					t.Fatal(err)
				}
				return dls
			},
		},
	}
}

// A conflict is dead-lettered with the reason of its kind: a message-ID
// collision when the business keys differ, a payload conflict when the
// business key is the same (or there is none), in every mode and store.
func TestConflictReasons(t *testing.T) {
	t.Parallel()
	calls := newCallCounter()
	for _, p := range processors(t, calls, nil) {
		t.Run(p.name, func(t *testing.T) {
			scope := randomName("conflicts-")
			steps := []struct {
				mid, bk, payload string
				outcome          dedup.Outcome
				reason           string
				by               dedup.MatchedBy
				sentinel         error
			}{
				{"m-1", "order-1", `{"amount":1}`, dedup.OutcomeProcessed, "", "", nil},
				{"m-1", "order-2", `{"amount":2}`, dedup.OutcomeConflict, dedup.ReasonMessageIDCollision, dedup.ByMessageID, dedup.ErrMessageIDCollision},
				{"m-1", "order-1", `{"amount":3}`, dedup.OutcomeConflict, dedup.ReasonPayloadConflict, dedup.ByMessageID, dedup.ErrPayloadConflict},
				{"m-2", "order-1", `{"amount":4}`, dedup.OutcomeConflict, dedup.ReasonPayloadConflict, dedup.ByBusinessKey, dedup.ErrPayloadConflict},
				{"m-3", "", `{"amount":5}`, dedup.OutcomeProcessed, "", "", nil},
				{"m-3", "", `{"amount":6}`, dedup.OutcomeConflict, dedup.ReasonPayloadConflict, dedup.ByMessageID, dedup.ErrPayloadConflict},
				{"m-1", "order-1", `{"amount":1}`, dedup.OutcomeDuplicate, "", dedup.ByMessageID, nil},
				{"m-1", "order-2", `{"amount":2}`, dedup.OutcomeConflict, dedup.ReasonMessageIDCollision, dedup.ByMessageID, dedup.ErrMessageIDCollision}, // a copy: no new dead letter
			}
			for i, s := range steps {
				r := p.process(t, msg(t, scope, s.mid, s.bk, s.payload))
				if r.Outcome != s.outcome || r.Reason != s.reason || r.MatchedBy != s.by {
					t.Fatalf("step %d (%s/%s %s): %s reason %q by %q; want %s reason %q by %q (%+v)", i, s.mid, s.bk, s.payload,
						r.Outcome, r.Reason, r.MatchedBy, s.outcome, s.reason, s.by, r)
				}
				if s.sentinel != nil {
					var ce *dedup.ConflictError
					if !errors.Is(r.Err, s.sentinel) || !errors.Is(r.Err, dedup.ErrFingerprintConflict) || !errors.As(r.Err, &ce) || ce.Reason != s.reason {
						t.Fatalf("step %d: Err = %v, want %v", i, r.Err, s.sentinel)
					}
				}
			}
			var got []string
			for _, d := range p.deadLet(t, scope) {
				got = append(got, d.MessageID+" "+d.Reason+" "+d.ErrorClass)
			}
			want := []string{"m-1 message_id_collision message_id_collision", "m-1 payload_conflict payload_conflict",
				"m-2 payload_conflict payload_conflict", "m-3 payload_conflict payload_conflict"}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("dead letters %q, want %q", got, want)
			}
		})
	}
}

// A record of bad input re-driven by the operator runs the handler on its
// next copy (it was a conflict with itself: the rejected record had no
// fingerprint). Both ways a record of bad input is made: the business-key
// extractor failed (Reject; the payload can be fingerprinted), and the
// canonicalizer refused the payload (no fingerprint at all until the copy
// after the re-drive gives it one). In every mode and store.
func TestRedrivenBadInputRuns(t *testing.T) {
	t.Parallel()
	t.Run("rejected", func(t *testing.T) {
		t.Parallel()
		calls := newCallCounter()
		for _, p := range processors(t, calls, nil) {
			t.Run(p.name, func(t *testing.T) {
				scope := randomName("bad-")
				m := func() *dedup.Message { return msg(t, scope, "m-bad", "", `{"order":"o-1"}`) }
				if r := p.reject(t, m()); r.Outcome != dedup.OutcomeDeadLetter || r.Reason != dedup.ReasonBadInput {
					t.Fatalf("reject: %+v", r)
				}
				if r := p.process(t, m()); r.Outcome != dedup.OutcomeDuplicate {
					t.Fatalf("a copy before the re-drive: %+v, want duplicate", r)
				}
				p.redrive(t, scope, "m-bad")
				if r := p.process(t, m()); r.Outcome != dedup.OutcomeProcessed || !r.HandlerCalled || calls.get("m-bad") != 1 {
					t.Fatalf("the copy after the re-drive: %+v, handler calls %d; want processed once", r, calls.get("m-bad"))
				}
				if r := p.process(t, m()); r.Outcome != dedup.OutcomeDuplicate {
					t.Fatalf("a later copy: %+v, want duplicate", r)
				}
				if n := len(p.deadLet(t, scope)); n != 1 {
					t.Fatalf("dead letters = %d, want the bad_input one only", n)
				}
				calls.reset("m-bad")
			})
		}
	})
	t.Run("not fingerprintable", func(t *testing.T) {
		t.Parallel()
		var refuse atomic.Bool // the canonicalizer refuses every payload while set
		fp, err := dedup.NewFingerprinter(func(b []byte) ([]byte, error) {
			if refuse.Load() {
				return nil, errors.New("schema v2 not known yet")
			}
			return b, nil
		}, dedup.FingerprintKey{ID: "k1", Secret: []byte("integration-test-secret-0123456789")})
		if err != nil {
			t.Fatal(err)
		}
		calls := newCallCounter()
		for _, p := range processors(t, calls, fp) {
			t.Run(p.name, func(t *testing.T) {
				scope := randomName("canon-")
				m := func() *dedup.Message { return msg(t, scope, "m-v2", "", `{"v":2}`) }
				refuse.Store(true)
				r := p.process(t, m())
				refuse.Store(false)
				if r.Outcome != dedup.OutcomeDeadLetter || r.Reason != dedup.ReasonBadInput || r.HandlerCalled {
					t.Fatalf("payload refused by the canonicalizer: %+v", r)
				}
				if rec, err := p.lookup.Lookup(context.Background(), scope, "m-v2"); err != nil || len(rec.Fingerprint) != 0 {
					t.Fatalf("rejected record %+v, %v; want no fingerprint", rec, err)
				}
				p.redrive(t, scope, "m-v2")
				if r := p.process(t, m()); r.Outcome != dedup.OutcomeProcessed || calls.get("m-v2") != 1 {
					t.Fatalf("the copy after the re-drive: %+v, handler calls %d; want processed once", r, calls.get("m-v2"))
				}
				if rec, err := p.lookup.Lookup(context.Background(), scope, "m-v2"); err != nil || len(rec.Fingerprint) != 32 || rec.Status != dedup.StatusSucceeded {
					t.Fatalf("record %+v, %v; want SUCCEEDED with the copy's fingerprint", rec, err)
				}
				if r := p.process(t, msg(t, scope, "m-v2", "", `{"v":3}`)); r.Outcome != dedup.OutcomeConflict || r.Reason != dedup.ReasonPayloadConflict {
					t.Fatalf("another payload under the same ID: %+v, want a payload conflict", r)
				}
				calls.reset("m-v2")
			})
		}
	})
}

func (c *callCounter) reset(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.n, id)
}
