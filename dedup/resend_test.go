package dedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestAnswerLost(t *testing.T) {
	lost := []error{
		io.EOF,
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF),
		&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET},
		&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"},
		&pgconn.PgError{Code: "57P02"},
		&pgconn.PgError{Code: "57P03"},
		&pgconn.PgError{Code: "08006"},
		fmt.Errorf("idemq: commit: %w", &pgconn.PgError{Code: "08003"}),
	}
	for _, err := range lost {
		if !answerLost(err) {
			t.Errorf("answerLost(%v) = false, want true", err)
		}
	}
	answered := []error{
		nil,
		errors.New("handler said no"),
		&pgconn.PgError{Code: "23505"},
		&pgconn.PgError{Code: "40001"},
		&pgconn.PgError{Code: "57014"}, // query canceled: an answer
		context.Canceled,
		fmt.Errorf("x: %w", context.DeadlineExceeded),
		errors.Join(io.EOF, context.Canceled), // ctx ended: stop
	}
	for _, err := range answered {
		if answerLost(err) {
			t.Errorf("answerLost(%v) = true, want false", err)
		}
	}
}

func TestResend(t *testing.T) {
	ctx := context.Background()
	calls := 0
	err := resend(ctx, func() error {
		calls++
		if calls < 3 {
			return io.ErrUnexpectedEOF
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("lost twice, then answered: err %v after %d calls; want nil after 3", err, calls)
	}

	calls = 0
	err = resend(ctx, func() error { calls++; return io.EOF })
	if !errors.Is(err, io.EOF) || calls != 1+leaseResends {
		t.Fatalf("always lost: err %v after %d calls; want EOF after %d", err, calls, 1+leaseResends)
	}

	calls = 0
	refused := &pgconn.PgError{Code: "23505"}
	if err := resend(ctx, func() error { calls++; return refused }); err != refused || calls != 1 {
		t.Fatalf("an answer: err %v after %d calls; want it after 1", err, calls)
	}

	cctx, cancel := context.WithCancel(ctx)
	calls = 0
	err = resend(cctx, func() error { calls++; cancel(); return io.EOF })
	if !errors.Is(err, io.EOF) || !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("ctx ended: err %v after %d calls; want EOF and Canceled after 1", err, calls)
	}
}
