package dedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func pgErr(code string) error { return &pgconn.PgError{Severity: "ERROR", Code: code} }

func TestClassify(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want FailureClass
	}{
		{"nil", nil, FailureNone},
		{"40001 serialization failure", pgErr("40001"), FailureTransient},
		{"40P01 deadlock", pgErr("40P01"), FailureTransient},
		{"40001 wrapped", fmt.Errorf("insert: %w", pgErr("40001")), FailureTransient},
		{"08000 connection exception", pgErr("08000"), FailureOutcomeUnknown},
		{"08003 connection does not exist", pgErr("08003"), FailureOutcomeUnknown},
		{"08006 connection failure", pgErr("08006"), FailureOutcomeUnknown},
		{"08P01 protocol violation", pgErr("08P01"), FailureOutcomeUnknown},
		{"57P01 admin shutdown", &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}, FailureOutcomeUnknown},
		{"57P02 crash shutdown", pgErr("57P02"), FailureOutcomeUnknown},
		{"57P03 cannot connect now", pgErr("57P03"), FailureOutcomeUnknown},
		{"57014 statement timeout", pgErr("57014"), FailureHandler},
		{"23505 unique violation", pgErr("23505"), FailureHandler},
		{"25P02 aborted transaction", pgErr("25P02"), FailureHandler},
		{"40002 integrity constraint (not a serialization failure)", pgErr("40002"), FailureHandler},
		{"42P01 undefined table", pgErr("42P01"), FailureHandler},
		{"io.EOF", fmt.Errorf("receive: %w", io.EOF), FailureOutcomeUnknown},
		{"io.ErrUnexpectedEOF", io.ErrUnexpectedEOF, FailureOutcomeUnknown},
		{"ECONNRESET", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, FailureOutcomeUnknown},
		{"ECONNREFUSED bare", syscall.ECONNREFUSED, FailureOutcomeUnknown},
		{"EPIPE bare", fmt.Errorf("write: %w", syscall.EPIPE), FailureOutcomeUnknown},
		{"net.ErrClosed", net.ErrClosed, FailureOutcomeUnknown},
		{"pgconn.ErrConnClosed", fmt.Errorf("x: %w", pgconn.ErrConnClosed), FailureOutcomeUnknown},
		{"connect error", &pgconn.ConnectError{}, FailureOutcomeUnknown},
		{"context canceled", context.Canceled, FailureOutcomeUnknown},
		{"deadline exceeded", fmt.Errorf("query: %w", context.DeadlineExceeded), FailureOutcomeUnknown},
		{"ErrOutcomeUnknown", fmt.Errorf("%w: commit: %w", ErrOutcomeUnknown, errors.New("x")), FailureOutcomeUnknown},
		{"ErrOutcomeUnknown over a PgError", fmt.Errorf("%w: %w", ErrOutcomeUnknown, pgErr("23505")), FailureOutcomeUnknown},
		{"permanent", Permanent(errors.New("bad amount")), FailurePermanent},
		{"permanent wins over what it wraps", Permanent(pgErr("40001")), FailurePermanent},
		{"panic", &PanicError{Value: "boom"}, FailureHandler},
		{"plain", errors.New("plain"), FailureHandler},
		{"not a connection error", fs.ErrNotExist, FailureHandler},
	}
	for _, c := range cases {
		if got := Classify(c.err); got != c.want {
			t.Errorf("%s: Classify(%v) = %q, want %q", c.name, c.err, got, c.want)
		}
	}
	if !IsTransient(pgErr("40P01")) || IsTransient(pgErr("23505")) || IsTransient(nil) {
		t.Error("IsTransient")
	}
	if !IsOutcomeUnknown(pgErr("57P01")) || IsOutcomeUnknown(pgErr("40001")) || IsOutcomeUnknown(nil) {
		t.Error("IsOutcomeUnknown")
	}
}

// A failed COMMIT: a server error means it did not commit (the handler's
// failure, or transient); anything else leaves the outcome unknown.
func TestCommitFailureClass(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want FailureClass
	}{
		{"aborted transaction answered ROLLBACK", pgx.ErrTxCommitRollback, FailureHandler},
		{"deferred unique violation", pgErr("23505"), FailureHandler},
		{"deferred trigger error", fmt.Errorf("commit: %w", pgErr("P0001")), FailureHandler},
		{"serialization failure", pgErr("40001"), FailureTransient},
		{"deadlock", pgErr("40P01"), FailureTransient},
		{"terminated", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, FailureOutcomeUnknown},
		{"connection failure", pgErr("08006"), FailureOutcomeUnknown},
		{"io", io.ErrUnexpectedEOF, FailureOutcomeUnknown},
		{"context", context.Canceled, FailureOutcomeUnknown},
		{"anything else that is not a server error", errors.New("weird"), FailureOutcomeUnknown},
	}
	for _, c := range cases {
		if got := commitFailureClass(c.err); got != c.want {
			t.Errorf("%s: commitFailureClass = %q, want %q", c.name, got, c.want)
		}
	}
}

// A handler's own error is its failure, even an io error (an HTTP call),
// unless its transaction lost its connection or the caller's ctx ended.
func TestHandlerFailureClass(t *testing.T) {
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want FailureClass
	}{
		{"plain", live, errors.New("x"), FailureHandler},
		{"io error of an HTTP call", live, fmt.Errorf("post: %w", io.ErrUnexpectedEOF), FailureHandler},
		{"its own deadline", live, fmt.Errorf("call: %w", context.DeadlineExceeded), FailureHandler},
		{"serialization failure", live, pgErr("40001"), FailureTransient},
		{"permanent", live, Permanent(errors.New("x")), FailurePermanent},
		{"shutdown", ended, errors.New("x"), FailureOutcomeUnknown},
	}
	for _, c := range cases {
		if got := handlerFailureClass(c.ctx, nil, c.err); got != c.want {
			t.Errorf("%s: handlerFailureClass = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestWrapUnknown(t *testing.T) {
	err := wrapUnknown(io.EOF)
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, io.EOF) {
		t.Fatalf("wrapUnknown(io.EOF) = %v", err)
	}
	if again := wrapUnknown(err); again != err {
		t.Fatalf("wrapped twice: %v", again)
	}
	if e := pgErr("23505"); wrapUnknown(e) != e {
		t.Fatal("a handler-class error was wrapped")
	}
}

func TestRetryPolicy(t *testing.T) {
	p := RetryPolicy{}.withDefaults(defaultTransientRetry)
	if p != defaultTransientRetry || p.tries() != 4 {
		t.Fatalf("defaults: %+v, tries %d", p, p.tries())
	}
	if p := (RetryPolicy{Attempts: -1}).withDefaults(defaultTransientRetry); p.tries() != 1 {
		t.Fatalf("negative Attempts: tries %d, want 1", p.tries())
	}
	if p := (RetryPolicy{Initial: time.Second}).withDefaults(defaultTransientRetry); p.Max != time.Second {
		t.Fatalf("Max under a larger Initial: %+v", p)
	}
	for _, bad := range []RetryPolicy{{Attempts: 101, Initial: 1, Max: 1}, {Attempts: 1, Initial: -1, Max: 1},
		{Attempts: 1, Initial: time.Second, Max: time.Millisecond}, {Attempts: 1, Initial: 1, Max: 2 * time.Minute}} {
		if err := bad.validate("TransientRetry"); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v accepted: %v", bad, err)
		}
	}

	log := slog.New(slog.DiscardHandler)
	fast := RetryPolicy{Attempts: 3, Initial: time.Microsecond, Max: time.Microsecond}
	tries := 0
	_, err := retryWhile(context.Background(), fast, log, "t", IsTransient, func() (int, error) { tries++; return tries, pgErr("40001") })
	if tries != 4 || !IsTransient(err) {
		t.Fatalf("always transient: %d tries, %v; want 4 and the last error", tries, err)
	}
	tries = 0
	n, err := retryWhile(context.Background(), fast, log, "t", IsTransient, func() (int, error) {
		tries++
		if tries == 2 {
			return tries, pgErr("23505")
		}
		return tries, pgErr("40001")
	})
	if tries != 2 || n != 2 || IsTransient(err) || err == nil {
		t.Fatalf("stops at a non-retryable error: %d tries, %v", tries, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tries = 0
	_, err = retryWhile(ctx, RetryPolicy{Attempts: 3, Initial: time.Hour, Max: time.Hour}, log, "t", IsTransient, func() (int, error) { tries++; return 0, pgErr("40001") })
	if tries != 1 || !errors.Is(err, context.Canceled) {
		t.Fatalf("ctx ended: %d tries, %v", tries, err)
	}
}

func TestConfigTxOptionsAndRetryValidation(t *testing.T) {
	fp, _ := NewFingerprinter(nil, k1)
	c := Config{Fingerprinter: fp}.withDefaults()
	if c.TxOptions.IsoLevel != pgx.ReadCommitted || c.TransientRetry != defaultTransientRetry || c.OutcomeUnknownRetry != defaultOutcomeUnknownRetry {
		t.Fatalf("defaults: %+v %+v %+v", c.TxOptions, c.TransientRetry, c.OutcomeUnknownRetry)
	}
	for _, ok := range []pgx.TxOptions{{IsoLevel: pgx.RepeatableRead}, {IsoLevel: pgx.Serializable, AccessMode: pgx.ReadWrite, DeferrableMode: pgx.NotDeferrable}} {
		if err := (Config{Fingerprinter: fp, TxOptions: ok}).withDefaults().validate(); err != nil {
			t.Errorf("%+v refused: %v", ok, err)
		}
	}
	for _, bad := range []pgx.TxOptions{{IsoLevel: pgx.ReadUncommitted}, {IsoLevel: "snapshot"}, {AccessMode: pgx.ReadOnly},
		{IsoLevel: pgx.Serializable, DeferrableMode: pgx.Deferrable}, {BeginQuery: "begin"}, {CommitQuery: "commit"}} {
		if err := (Config{Fingerprinter: fp, TxOptions: bad}).withDefaults().validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v accepted: %v", bad, err)
		}
	}
	if err := (Config{Fingerprinter: fp, OutcomeUnknownRetry: RetryPolicy{Attempts: 1000}}).withDefaults().validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("OutcomeUnknownRetry.Attempts 1000 accepted: %v", err)
	}
}

// errMarks fails every mark with err.
type errMarks struct{ err error }

func (m errMarks) Renew(context.Context) (bool, error)   { return true, nil }
func (m errMarks) Succeed(context.Context) (bool, error) { return false, m.err }
func (m errMarks) Release(context.Context) error         { return nil }
func (m errMarks) Fail(context.Context, Status, string, error) (int64, bool, error) {
	return 0, false, m.err
}

// A lease-mode mark that fails leaves the delivery unacked with
// HandlerCalled and Attempts set; a lost connection wraps ErrOutcomeUnknown.
func TestRunLeaseMarkErrors(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	id := Identity{Scope: "s", MessageID: "m-1"}
	lease := Lease{Identity: id, Record: id, Attempt: 1, Fence: 1}
	opt := LeaseOptions{TTL: time.Minute, Heartbeat: -1}
	for _, h := range []LeaseHandler{
		func(context.Context, *Message) error { return nil },
		func(context.Context, *Message) error { return errors.New("provider said no") },
	} {
		res, err := RunLease(context.Background(), &Message{Identity: id}, lease, h, opt, 1, errMarks{err: io.ErrUnexpectedEOF}, log)
		if !errors.Is(err, ErrOutcomeUnknown) || !res.HandlerCalled || res.Attempts != 1 || res.Outcome != "" {
			t.Fatalf("lost connection: %+v, %v", res, err)
		}
		res, err = RunLease(context.Background(), &Message{Identity: id}, lease, h, opt, 1, errMarks{err: pgErr("42P01")}, log)
		if err == nil || errors.Is(err, ErrOutcomeUnknown) || !res.HandlerCalled {
			t.Fatalf("server error: %+v, %v", res, err)
		}
	}
}
