package lease

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemq/idemq/dedup"
)

// clockMarks is a Marks whose Renew answers from a script and records when,
// on the fake clock, each renewal began.
type clockMarks struct {
	mu        sync.Mutex
	start     time.Time
	renewals  []time.Duration
	renew     func(n int) (bool, error) // n counts renewals from 1
	succeeded int
	failed    dedup.Status
}

func newClockMarks(renew func(n int) (bool, error)) *clockMarks {
	return &clockMarks{start: time.Now(), renew: renew}
}

func (m *clockMarks) Renew(context.Context) (bool, error) {
	m.mu.Lock()
	m.renewals = append(m.renewals, time.Since(m.start))
	n := len(m.renewals)
	m.mu.Unlock()
	return m.renew(n)
}
func (m *clockMarks) Succeed(context.Context) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.succeeded++
	return false, nil
}
func (m *clockMarks) Fail(_ context.Context, st dedup.Status, _ string, _ error) (int64, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failed = st
	return 0, false, nil
}
func (m *clockMarks) Release(context.Context) error { return nil }

func (m *clockMarks) renewedAt() []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.renewals)
}

// seconds returns each n as n seconds.
func seconds(n ...int) []time.Duration {
	out := make([]time.Duration, len(n))
	for i, s := range n {
		out[i] = time.Duration(s) * time.Second
	}
	return out
}

// runTimed runs one lease-mode execution under opt with a handler that
// waits until its context ends or until work has passed, and reports when
// (fake clock) the handler returned and its context's cause.
func runTimed(t *testing.T, m *clockMarks, opt dedup.LeaseOptions, work time.Duration) (res dedup.Result, ended time.Duration, cause error) {
	t.Helper()
	id := dedup.Identity{Scope: "s", MessageID: "m-1"}
	res, err := Run(context.Background(), Params{
		Message: &dedup.Message{Identity: id}, Lease: dedup.Lease{Identity: id, Record: id, Attempt: 1, Fence: 1},
		Handler: func(ctx context.Context, _ *dedup.Message) error {
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
				ended = time.Since(m.start)
				return ctx.Err()
			case <-time.After(work):
				ended = time.Since(m.start)
				return nil
			}
		},
		Options: opt, MaxAttempts: 5, Marks: m,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res, ended, cause
}

// With the default options (TTL 30s, heartbeat TTL/3) a handler that runs
// 35s has its lease renewed at 10s, 20s and 30s, is never canceled, and
// its success is recorded. (Fake clock: testing/synctest.)
func TestRunRenewsAtAThirdOfTheTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newClockMarks(func(int) (bool, error) { return true, nil })
		res, ended, cause := runTimed(t, m, dedup.LeaseOptions{}, 35*time.Second)
		if cause != nil || ended != 35*time.Second || res.Outcome != dedup.OutcomeProcessed || m.succeeded != 1 {
			t.Fatalf("handler ended at %s (cause %v), %+v, %d successes; want 35s, no cause, processed, 1", ended, cause, res, m.succeeded)
		}
		if got, want := m.renewedAt(), seconds(10, 20, 30); !slices.Equal(got, want) {
			t.Fatalf("renewals at %v, want %v", got, want)
		}
	})
}

// Renewals that fail (the store unreachable) cancel the handler with
// ErrLeaseExpired at 90% of the TTL after the claim (27s of 30s), or after
// the start of the last successful renewal; the failure is then recorded as
// a retry.
func TestRunExpiryCancelsAtNinetyPercentOfTheTTL(t *testing.T) {
	for _, tc := range []struct {
		name    string
		okUntil int // renewals 1..okUntil succeed
		cancel  time.Duration
		renews  []time.Duration
	}{
		{"never renewed", 0, 27 * time.Second, seconds(10, 20)},
		{"renewed at 10s", 1, 37 * time.Second, seconds(10, 20, 30)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := newClockMarks(func(n int) (bool, error) {
					if n <= tc.okUntil {
						return true, nil
					}
					return false, errors.New("store unreachable")
				})
				res, ended, cause := runTimed(t, m, dedup.LeaseOptions{TTL: 30 * time.Second}, time.Hour)
				if !errors.Is(cause, dedup.ErrLeaseExpired) || ended != tc.cancel {
					t.Fatalf("handler canceled at %s with %v, want %s with ErrLeaseExpired", ended, cause, tc.cancel)
				}
				if got := m.renewedAt(); !slices.Equal(got, tc.renews) {
					t.Fatalf("renewals at %v, want %v", got, tc.renews)
				}
				if res.Outcome != dedup.OutcomeRetry || m.failed != dedup.StatusFailedRetryable {
					t.Fatalf("%+v, marked %q; want a retry", res, m.failed)
				}
			})
		})
	}
}

// A renewal that finds another owner cancels the handler with ErrFenced at
// that heartbeat, and nothing is marked: the outcome is OutcomeFenced.
func TestRunFencedAtTheHeartbeatThatFindsAnotherOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newClockMarks(func(n int) (bool, error) { return n < 2, nil })
		res, ended, cause := runTimed(t, m, dedup.LeaseOptions{TTL: 9 * time.Second, Heartbeat: 2 * time.Second}, time.Hour)
		if !errors.Is(cause, dedup.ErrFenced) || ended != 4*time.Second {
			t.Fatalf("handler canceled at %s with %v, want 4s (the second heartbeat) with ErrFenced", ended, cause)
		}
		if res.Outcome != dedup.OutcomeFenced || m.succeeded != 0 || m.failed != "" {
			t.Fatalf("%+v, %d successes, marked %q; want fenced and no mark", res, m.succeeded, m.failed)
		}
	})
}
