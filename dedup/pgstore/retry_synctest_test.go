package pgstore

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"
)

var errTransient = errors.New("connection reset")

// triesAt runs retryWhile under p with an op that fails with errTransient
// until call okAt (0: always), and returns the fake-clock times of the
// calls, from the start.
func triesAt(ctx context.Context, p RetryPolicy, okAt int) ([]time.Duration, error) {
	start := time.Now()
	var at []time.Duration
	_, err := retryWhile(ctx, p, slog.New(slog.DiscardHandler), "test",
		func(err error) bool { return errors.Is(err, errTransient) },
		func() (int, error) {
			at = append(at, time.Since(start))
			if len(at) == okAt {
				return len(at), nil
			}
			return 0, errTransient
		})
	return at, err
}

// retryWhile's schedule on the fake clock (testing/synctest): the first try
// at once, then Attempts retries, the nominal delay starting at Initial,
// doubling, capped at Max, each jittered by ±50%.
func TestRetryWhileBackoffDoublesAndCaps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := RetryPolicy{Attempts: 20, Initial: 100 * time.Millisecond, Max: 400 * time.Millisecond}
		at, err := triesAt(context.Background(), p, 0)
		if !errors.Is(err, errTransient) {
			t.Fatalf("err = %v, want the last try's error", err)
		}
		if len(at) != 21 || at[0] != 0 {
			t.Fatalf("tries at %v, want 21, the first at 0", at)
		}
		for i := range 20 {
			n := []time.Duration{100, 200, 400}[min(i, 2)] * time.Millisecond
			gap := at[i+1] - at[i]
			if gap < n/2 || gap > n*3/2 {
				t.Fatalf("delay before retry %d = %s, want %s ±50%% (tries at %v)", i+1, gap, n, at)
			}
		}
	})
}

// Success, a non-retryable error and a policy without retries end at once;
// a ctx that ends during a delay ends the wait then, with the last try's
// error joined to ctx's cause.
func TestRetryWhileStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := RetryPolicy{Attempts: 3, Initial: time.Second, Max: time.Second}
		if at, err := triesAt(context.Background(), p, 2); err != nil || len(at) != 2 {
			t.Fatalf("success on try 2: tries at %v, %v", at, err)
		}
		start := time.Now()
		_, err := retryWhile(context.Background(), p, slog.New(slog.DiscardHandler), "test",
			func(error) bool { return false }, func() (int, error) { return 0, errors.New("syntax error") })
		if err == nil || time.Since(start) != 0 {
			t.Fatalf("non-retryable: %v after %s, want the error at once", err, time.Since(start))
		}
		if at, err := triesAt(context.Background(), RetryPolicy{Disable: true}, 0); len(at) != 1 || !errors.Is(err, errTransient) {
			t.Fatalf("no retries: tries at %v, %v; want one try", at, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start = time.Now()
		at, err := triesAt(ctx, RetryPolicy{Attempts: 3, Initial: time.Minute, Max: time.Minute}, 0)
		if len(at) != 1 || !errors.Is(err, errTransient) || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 200*time.Millisecond {
			t.Fatalf("ctx ends in a delay: tries at %v, %v after %s; want one try, both errors, at 200ms", at, err, time.Since(start))
		}
	})
}
