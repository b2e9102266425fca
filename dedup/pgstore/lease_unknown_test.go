package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// notSent is an error pgx says it raised before it sent anything.
type notSent struct{}

func (notSent) Error() string     { return "conn busy" }
func (notSent) SafeToRetry() bool { return true }

// retryStore is a Store with only what markRetry reads: its retry policies.
func retryStore(outcomeUnknown, transient RetryPolicy) *Store {
	return &Store{cfg: Config{
		Logger:              slog.New(slog.DiscardHandler),
		OutcomeUnknownRetry: outcomeUnknown,
		TransientRetry:      transient,
	}}
}

// Which errors of a lease-mode claim or mark are retried in place, and
// under which policy: a lost answer (the connection failed, the server
// ended the session, pgx never sent it) under OutcomeUnknownRetry, a
// serialization failure or deadlock under TransientRetry, any other answer
// of the server not at all. The classes come from Classify alone.
func TestLeaseCallRetriedByClass(t *testing.T) {
	fast := RetryPolicy{Attempts: 5, Initial: time.Microsecond, Max: time.Microsecond}
	s := retryStore(fast, RetryPolicy{Attempts: 2, Initial: time.Microsecond, Max: time.Microsecond})
	tries := func(err error) int {
		n := 0
		_, got := markRetry(context.Background(), s, "t", func() (bool, error) { n++; return false, err })
		if !errors.Is(got, err) {
			t.Errorf("%v: markRetry returned %v, want that error", err, got)
		}
		return n
	}
	lost := []error{
		io.EOF,
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF),
		&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET},
		&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"},
		&pgconn.PgError{Code: "57P02"},
		&pgconn.PgError{Code: "57P03"},
		&pgconn.PgError{Code: "08006"},
		fmt.Errorf("idemq: commit: %w", &pgconn.PgError{Code: "08003"}),
		fmt.Errorf("acquire: %w", notSent{}),
	}
	for _, err := range lost {
		if n := tries(err); n != 1+fast.Attempts {
			t.Errorf("%v: %d tries, want %d (OutcomeUnknownRetry)", err, n, 1+fast.Attempts)
		}
	}
	for _, err := range []error{&pgconn.PgError{Code: "40001"}, &pgconn.PgError{Code: "40P01"}} {
		if n := tries(err); n != 3 {
			t.Errorf("%v: %d tries, want 3 (TransientRetry, not OutcomeUnknownRetry)", err, n)
		}
	}
	answered := []error{
		errors.New("handler said no"),
		&pgconn.PgError{Code: "23505"},
		&pgconn.PgError{Code: "57014"}, // query canceled: an answer
		&pgconn.PgError{Code: "42P01"},
	}
	for _, err := range answered {
		if n := tries(err); n != 1 {
			t.Errorf("%v: %d tries, want 1 (an answer is not retried)", err, n)
		}
	}
}

func TestLeaseCallRetryPolicy(t *testing.T) {
	ctx := context.Background()
	fast := RetryPolicy{Attempts: 3, Initial: time.Microsecond, Max: time.Microsecond}

	// Lost twice, then answered: the answer.
	s := retryStore(fast, fast)
	calls := 0
	ok, err := markRetry(ctx, s, "t", func() (bool, error) {
		calls++
		if calls < 3 {
			return false, io.ErrUnexpectedEOF
		}
		return true, nil
	})
	if err != nil || !ok || calls != 3 {
		t.Fatalf("lost twice, then answered: %v, %v after %d calls; want true, nil after 3", ok, err, calls)
	}

	// A lost answer, then a deadlock, then the answer: each class under its
	// own policy, in one run.
	calls = 0
	_, err = markRetry(ctx, s, "t", func() (bool, error) {
		calls++
		switch calls {
		case 1:
			return false, io.EOF
		case 2:
			return false, &pgconn.PgError{Code: "40P01"}
		}
		return true, nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("lost, deadlock, answered: %v after %d calls; want nil after 3", err, calls)
	}

	// No retry at all (Attempts < 0): one call, its error.
	calls = 0
	_, err = markRetry(ctx, retryStore(RetryPolicy{Disable: true}.withDefaults(defaultOutcomeUnknownRetry), fast), "t",
		func() (bool, error) { calls++; return false, io.EOF })
	if !errors.Is(err, io.EOF) || calls != 1 {
		t.Fatalf("Attempts -1: %v after %d calls; want EOF after 1", err, calls)
	}

	// The delay follows the policy: with a long Initial, a ctx that ends
	// during the first wait stops the retries, and the error holds both
	// the lost answer and the end of ctx.
	cctx, cancel := context.WithCancel(ctx)
	calls = 0
	slow := RetryPolicy{Attempts: 3, Initial: time.Hour, Max: time.Hour}
	_, err = markRetry(cctx, retryStore(slow, fast), "t", func() (bool, error) { calls++; cancel(); return false, io.EOF })
	if !errors.Is(err, io.EOF) || !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("ctx ended: %v after %d calls; want EOF and Canceled after 1", err, calls)
	}
}
