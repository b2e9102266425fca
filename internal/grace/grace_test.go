package grace

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// The work context outlives ctx by exactly d (fake clock: testing/synctest),
// ends with ctx when d is 0, and ends at once on release.
func TestWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, d := range []time.Duration{0, 100 * time.Millisecond, 10 * time.Second} {
			ctx, cancel := context.WithCancel(context.Background())
			work, release := Work(ctx, d)
			time.Sleep(time.Hour) // ctx still running: no deadline for the work
			if work.Err() != nil {
				t.Fatalf("grace %s: work ended before ctx did", d)
			}
			cancel()
			ended := time.Now()
			<-work.Done()
			if took := time.Since(ended); took != d {
				t.Fatalf("grace %s: work ended %s after ctx, want %s", d, took, d)
			}
			release()
		}

		work, release := Work(context.Background(), time.Hour)
		release()
		if work.Err() == nil {
			t.Fatal("release must end the work context")
		}
	})
}
