package memstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/storetest"
)

// harness is a fresh store in mode, with the suite's hooks: ExpireLease and
// ExpireRecord move one record's deadline into the past.
func harness(t *testing.T, mode func(*Store) storetest.Mode) storetest.Harness {
	s, err := New(Config{MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	expire := func(set func(*record, time.Time)) func(ctx context.Context, scope, messageID string) error {
		return func(_ context.Context, scope, messageID string) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			r := s.byID[ident{scope, messageID}]
			if r == nil {
				return fmt.Errorf("no record %s/%s", scope, messageID)
			}
			set(r, s.now().Add(-time.Nanosecond))
			return nil
		}
	}
	return storetest.Harness{
		Store: s, Mode: mode(s), Admin: s,
		ExpireLease:  expire(func(r *record, past time.Time) { r.leaseUntil = past }),
		ExpireRecord: expire(func(r *record, past time.Time) { r.ExpiresAt = &past }),
		Purge: func(ctx context.Context) error {
			_, err := s.Purge(ctx)
			return err
		},
	}
}

func TestConformanceLease(t *testing.T) {
	storetest.Run(t, storetest.Features{}, func(t *testing.T) storetest.Harness {
		return harness(t, func(s *Store) storetest.Mode { return storetest.Leased(s, dedup.LeaseOptions{}) })
	})
}

// Atomic and batched modes: no start markers (a unit test's process does
// not die under its handler).
func TestConformanceAtomic(t *testing.T) {
	storetest.Run(t, storetest.Features{NoStartMarkers: true}, func(t *testing.T) storetest.Harness {
		return harness(t, func(s *Store) storetest.Mode { return storetest.Atomic(s) })
	})
}

func TestConformanceBatched(t *testing.T) {
	storetest.Run(t, storetest.Features{NoStartMarkers: true}, func(t *testing.T) storetest.Harness {
		return harness(t, func(s *Store) storetest.Mode { return storetest.Batched(s) })
	})
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{MaxAttempts: -1}, "MaxAttempts"},
		{Config{MaxAttempts: 1001}, "MaxAttempts"},
		{Config{SucceededRetention: -time.Second}, "SucceededRetention"},
		{Config{SucceededRetention: time.Hour, FailedRetention: time.Minute}, "FailedRetention"},
	} {
		_, err := New(c.cfg)
		if !errors.Is(err, ErrInvalidConfig) || !containsWord(err.Error(), c.field) {
			t.Errorf("New(%+v) = %v; want ErrInvalidConfig naming %s", c.cfg, err, c.field)
		}
	}
}

func containsWord(s, w string) bool {
	for i := 0; i+len(w) <= len(s); i++ {
		if s[i:i+len(w)] == w {
			return true
		}
	}
	return false
}

// A Tx's writes and OnCommit functions apply only with a SUCCEEDED record;
// a failed or interrupted run leaves nothing, and an interrupted run is not
// counted.
func TestTxAppliedOnlyOnSuccess(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := dedup.NewIdentity("s", "m-1", "", "")
	msg := func() *dedup.Message { return &dedup.Message{Identity: id, Payload: []byte("x")} }
	committed := 0
	res, err := s.Process(context.Background(), msg(), func(_ context.Context, tx *Tx, _ *dedup.Message) error {
		tx.Set("k", []byte("failed"))
		tx.OnCommit(func() { committed++ })
		return errors.New("boom")
	})
	if err != nil || res.Outcome != dedup.OutcomeRetry {
		t.Fatalf("failed run: %+v, %v", res, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	_, err = s.Process(ctx, msg(), func(ctx context.Context, tx *Tx, _ *dedup.Message) error {
		tx.Set("k", []byte("interrupted"))
		cancel()
		return ctx.Err()
	})
	if !errors.Is(err, dedup.ErrOutcomeUnknown) {
		t.Fatalf("interrupted run: %v; want ErrOutcomeUnknown", err)
	}
	if _, ok := s.Get("k"); ok || committed != 0 {
		t.Fatalf("writes of failed runs applied (committed %d)", committed)
	}
	if r, _ := s.Lookup(context.Background(), "s", "m-1"); r.Attempts != 1 || r.Status != dedup.StatusFailedRetryable {
		t.Fatalf("record = %+v; want the interrupted run not counted", r)
	}
	res, err = s.Process(context.Background(), msg(), func(_ context.Context, tx *Tx, _ *dedup.Message) error {
		if _, ok := tx.Get("k"); ok {
			return errors.New("sees a dropped write")
		}
		tx.Set("k", []byte("ok"))
		if v, _ := tx.Get("k"); string(v) != "ok" {
			return errors.New("does not see its own write")
		}
		tx.OnCommit(func() { committed++ })
		return nil
	})
	if v, _ := s.Get("k"); err != nil || res.Outcome != dedup.OutcomeProcessed || string(v) != "ok" || committed != 1 {
		t.Fatalf("run: %+v, %v, value %q, committed %d", res, err, v, committed)
	}
}
