package leasewatch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestKeep(t *testing.T) {
	ctx := context.Background()
	held := func(context.Context) (bool, error) { return true, nil }
	none := func(error) {}

	// Renewals every 20ms keep a 500ms lease for a whole second (ample
	// room for a loaded machine); without them it would expire at 450ms.
	stop := make(chan struct{})
	time.AfterFunc(time.Second, func() { close(stop) })
	if got := Keep(ctx, 500*time.Millisecond, 20*time.Millisecond, stop, held, none); got != Kept {
		t.Fatalf("renewing lease: %v, want Kept (renewals must push the expiry back)", got)
	}
	if got := Keep(ctx, 50*time.Millisecond, -1, make(chan struct{}), held, none); got != Expired {
		t.Fatalf("no heartbeat: %v, want Expired", got)
	}
	var warned atomic.Int32
	failing := func(context.Context) (bool, error) { return false, errors.New("unreachable") }
	if got := Keep(ctx, 300*time.Millisecond, 10*time.Millisecond, make(chan struct{}), failing, func(error) { warned.Add(1) }); got != Expired || warned.Load() == 0 {
		t.Fatalf("failing renewals: %v after %d warnings, want Expired after some", got, warned.Load())
	}
	lost := func(context.Context) (bool, error) { return false, nil }
	if got := Keep(ctx, time.Second, 10*time.Millisecond, make(chan struct{}), lost, none); got != Fenced {
		t.Fatalf("taken over: %v, want Fenced", got)
	}
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
