package leasewatch

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
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
