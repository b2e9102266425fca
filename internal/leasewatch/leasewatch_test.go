package leasewatch

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// renewLog is a renew func that answers from a script and records when,
// on the fake clock, each call began.
type renewLog struct {
	mu     sync.Mutex
	start  time.Time
	at     []time.Duration
	answer func(n int) (bool, error) // n counts calls from 1
}

func newRenewLog(answer func(n int) (bool, error)) *renewLog {
	return &renewLog{start: time.Now(), answer: answer}
}

func (r *renewLog) renew(context.Context) (bool, error) {
	r.mu.Lock()
	r.at = append(r.at, time.Since(r.start))
	n := len(r.at)
	r.mu.Unlock()
	return r.answer(n)
}

func (r *renewLog) calls() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.at)
}

// Keep on the fake clock (testing/synctest): with the default heartbeat of
// TTL/3 a 3s lease is renewed at 1s, 2s, 3s, … and held as long as stop
// stays open; each successful renewal pushes the expiry back to 90% of the
// TTL after the renewal began.
func TestKeepRenewsEveryHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRenewLog(func(int) (bool, error) { return true, nil })
		stop := make(chan struct{})
		time.AfterFunc(9500*time.Millisecond, func() { close(stop) })
		if got := Keep(context.Background(), 3*time.Second, time.Second, stop, r.renew, func(error) {}); got != Kept {
			t.Fatalf("Keep = %v, want Kept (renewals must push the expiry back)", got)
		}
		if took := time.Since(r.start); took != 9500*time.Millisecond {
			t.Fatalf("Kept after %s, want 9.5s (when stop closed)", took)
		}
		want := []time.Duration{1 * time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second,
			6 * time.Second, 7 * time.Second, 8 * time.Second, 9 * time.Second}
		if got := r.calls(); !slices.Equal(got, want) {
			t.Fatalf("renewals at %v, want %v", got, want)
		}
	})
}

// Without a heartbeat the lease counts as expired at exactly 90% of the TTL
// after the claim.
func TestKeepExpiresWithoutHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRenewLog(func(int) (bool, error) { return true, nil })
		if got := Keep(context.Background(), 3*time.Second, -1, make(chan struct{}), r.renew, func(error) {}); got != Expired {
			t.Fatalf("Keep = %v, want Expired", got)
		}
		if took := time.Since(r.start); took != 2700*time.Millisecond {
			t.Fatalf("Expired after %s, want 2.7s (90%% of the 3s TTL)", took)
		}
		if n := len(r.calls()); n != 0 {
			t.Fatalf("%d renewals without a heartbeat, want 0", n)
		}
	})
}

// Failing renewals are warned about and retried every heartbeat; the lease
// expires 90% of the TTL after the start of the last successful renewal
// (or the claim), not later.
func TestKeepExpiresAfterFailingRenewals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		okUntil int           // calls 1..okUntil succeed, later ones fail
		expired time.Duration // when Keep returns Expired
		calls   []time.Duration
	}{
		{"never renewed", 0, 2700 * time.Millisecond, []time.Duration{time.Second, 2 * time.Second}},
		{"renewed at 1s", 1, 3700 * time.Millisecond, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRenewLog(func(n int) (bool, error) {
					if n <= tc.okUntil {
						return true, nil
					}
					return false, errors.New("store unreachable")
				})
				var warned atomic.Int32
				got := Keep(context.Background(), 3*time.Second, time.Second, make(chan struct{}), r.renew, func(error) { warned.Add(1) })
				if got != Expired {
					t.Fatalf("Keep = %v, want Expired", got)
				}
				if took := time.Since(r.start); took != tc.expired {
					t.Fatalf("Expired after %s, want %s", took, tc.expired)
				}
				if calls := r.calls(); !slices.Equal(calls, tc.calls) {
					t.Fatalf("renewals at %v, want %v", calls, tc.calls)
				}
				if w := int(warned.Load()); w != len(tc.calls)-tc.okUntil {
					t.Fatalf("%d warnings, want one per failed renewal (%d)", w, len(tc.calls)-tc.okUntil)
				}
			})
		})
	}
}

// A renewal that finds another owner ends Keep with Fenced at once: at the
// heartbeat that found it.
func TestKeepFencedAtTheRenewalThatFindsAnotherOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRenewLog(func(n int) (bool, error) { return n < 2, nil })
		if got := Keep(context.Background(), 3*time.Second, time.Second, make(chan struct{}), r.renew, func(error) {}); got != Fenced {
			t.Fatalf("Keep = %v, want Fenced", got)
		}
		if took := time.Since(r.start); took != 2*time.Second {
			t.Fatalf("Fenced after %s, want 2s (the second renewal)", took)
		}
	})
}

// A renewal that hangs, ignoring its context as a client blocked on a socket
// read does, ends in Expired by the lease's clock: 90% of the TTL after the
// last successful renewal began, not when the call returns. Each call's
// context carries that deadline. (Fake clock: testing/synctest.)
func TestKeepExpiresOnTheLeaseClockWhileRenewHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang) // lets the abandoned call finish before the bubble ends
		start := time.Now()
		var mu sync.Mutex // the hanging call runs on past Keep
		var calls int
		var deadlines []time.Duration
		renew := func(ctx context.Context) (bool, error) {
			d, _ := ctx.Deadline()
			mu.Lock()
			calls++
			n := calls
			deadlines = append(deadlines, d.Sub(start))
			mu.Unlock()
			if n == 1 {
				return true, nil // renewed at 100ms: the lease now expires at 100ms + 900ms
			}
			<-hang // Redis hung; go-redis waits ReadTimeout, not ctx
			return true, nil
		}
		got := Keep(context.Background(), time.Second, 100*time.Millisecond, make(chan struct{}), renew, func(error) {})
		if got != Expired {
			t.Fatalf("Keep = %v, want Expired", got)
		}
		if took := time.Since(start); took != time.Second {
			t.Fatalf("Expired after %s, want 1s (renewed at 100ms, + 900ms)", took)
		}
		mu.Lock()
		defer mu.Unlock()
		if calls != 2 || deadlines[0] != 900*time.Millisecond || deadlines[1] != time.Second {
			t.Fatalf("%d calls with deadlines %v, want 2: 900ms, then 1s", calls, deadlines)
		}
	})
}

// Closing stop returns Kept at once, even while a renewal hangs: the
// handler's outcome is never held up by a stuck heartbeat.
func TestKeepStopsWhileRenewHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang)
		stop := make(chan struct{})
		renewing := make(chan struct{})
		renew := func(context.Context) (bool, error) { close(renewing); <-hang; return true, nil }
		go func() { <-renewing; close(stop) }()
		start := time.Now()
		if got := Keep(context.Background(), time.Minute, time.Second, stop, renew, func(error) {}); got != Kept {
			t.Fatalf("Keep = %v, want Kept", got)
		}
		if took := time.Since(start); took != time.Second {
			t.Fatalf("returned %s after the start, want 1s (the first heartbeat)", took)
		}
	})
}
