package grace

import (
	"context"
	"testing"
	"time"
)

func TestWork(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	work, release := Work(ctx, 100*time.Millisecond)
	defer release()
	cancel()
	select {
	case <-work.Done():
		t.Fatal("work ended with ctx, before the grace period")
	case <-time.After(20 * time.Millisecond):
	}
	select {
	case <-work.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("work did not end after the grace period")
	}

	work2, release2 := Work(context.Background(), time.Hour)
	release2()
	if work2.Err() == nil {
		t.Fatal("release must end the work context")
	}
}
