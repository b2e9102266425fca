// Package grace gives in-flight work a bounded time to finish after a
// shutdown: the runtime's loops stop with ctx, the work they started runs on
// a context that ends ShutdownGrace later.
package grace

import (
	"context"
	"time"
)

// Work returns a context that ends d after ctx ends (at once when d is 0),
// or when release is called. Call release when the work is done; it stops
// the timer.
func Work(ctx context.Context, d time.Duration) (work context.Context, release func()) {
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(d, cancel)
		context.AfterFunc(work, func() { t.Stop() })
	})
	return work, func() { stop(); cancel() }
}
