package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func pgErr(code string) error { return &pgconn.PgError{Severity: "ERROR", Code: code} }

func TestClassify(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want dedup.FailureClass
	}{
		{"nil", nil, dedup.FailureNone},
		{"40001 serialization failure", pgErr("40001"), dedup.FailureTransient},
		{"40P01 deadlock", pgErr("40P01"), dedup.FailureTransient},
		{"40001 wrapped", fmt.Errorf("insert: %w", pgErr("40001")), dedup.FailureTransient},
		{"08000 connection exception", pgErr("08000"), dedup.FailureOutcomeUnknown},
		{"08003 connection does not exist", pgErr("08003"), dedup.FailureOutcomeUnknown},
		{"08006 connection failure", pgErr("08006"), dedup.FailureOutcomeUnknown},
		{"08P01 protocol violation", pgErr("08P01"), dedup.FailureOutcomeUnknown},
		{"57P01 admin shutdown", &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}, dedup.FailureOutcomeUnknown},
		{"57P02 crash shutdown", pgErr("57P02"), dedup.FailureOutcomeUnknown},
		{"57P03 cannot connect now", pgErr("57P03"), dedup.FailureOutcomeUnknown},
		{"57014 statement timeout", pgErr("57014"), dedup.FailureHandler},
		{"23505 unique violation", pgErr("23505"), dedup.FailureHandler},
		{"25P02 aborted transaction", pgErr("25P02"), dedup.FailureHandler},
		{"40002 integrity constraint (not a serialization failure)", pgErr("40002"), dedup.FailureHandler},
		{"0A000 cached plan changed by a schema change", fmt.Errorf("read: %w", &pgconn.PgError{Severity: "ERROR", Code: "0A000", Message: "cached plan must not change result type"}), dedup.FailureTransient},
		{"0A000 other feature not supported", &pgconn.PgError{Severity: "ERROR", Code: "0A000", Message: "cannot use subquery in check constraint"}, dedup.FailureHandler},
		{"26000 prepared statement does not exist", &pgconn.PgError{Severity: "ERROR", Code: "26000", Message: `prepared statement "stmtcache_1" does not exist`}, dedup.FailureTransient},
		{"a swallowed 23505 behind a 25P02", &causedError{err: fmt.Errorf("x: %w", pgErr("25P02")), cause: &pgconn.PgError{Code: "23505"}}, dedup.FailureHandler},
		{"a swallowed 40001 behind a 25P02", &causedError{err: errLeftAborted, cause: &pgconn.PgError{Code: "40001"}}, dedup.FailureTransient},
		{"42P01 undefined table", pgErr("42P01"), dedup.FailureHandler},
		{"io.EOF", fmt.Errorf("receive: %w", io.EOF), dedup.FailureOutcomeUnknown},
		{"io.ErrUnexpectedEOF", io.ErrUnexpectedEOF, dedup.FailureOutcomeUnknown},
		{"ECONNRESET", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, dedup.FailureOutcomeUnknown},
		{"ECONNREFUSED bare", syscall.ECONNREFUSED, dedup.FailureOutcomeUnknown},
		{"EPIPE bare", fmt.Errorf("write: %w", syscall.EPIPE), dedup.FailureOutcomeUnknown},
		{"net.ErrClosed", net.ErrClosed, dedup.FailureOutcomeUnknown},
		{"pgconn.ErrConnClosed", fmt.Errorf("x: %w", pgconn.ErrConnClosed), dedup.FailureOutcomeUnknown},
		{"connect error", &pgconn.ConnectError{}, dedup.FailureOutcomeUnknown},
		{"context canceled", context.Canceled, dedup.FailureOutcomeUnknown},
		{"deadline exceeded", fmt.Errorf("query: %w", context.DeadlineExceeded), dedup.FailureOutcomeUnknown},
		{"ErrOutcomeUnknown", fmt.Errorf("%w: commit: %w", dedup.ErrOutcomeUnknown, errors.New("x")), dedup.FailureOutcomeUnknown},
		{"ErrOutcomeUnknown over a PgError", fmt.Errorf("%w: %w", dedup.ErrOutcomeUnknown, pgErr("23505")), dedup.FailureOutcomeUnknown},
		{"permanent", dedup.Permanent(errors.New("bad amount")), dedup.FailurePermanent},
		{"permanent wins over what it wraps", dedup.Permanent(pgErr("40001")), dedup.FailurePermanent},
		{"panic", &dedup.PanicError{Value: "boom"}, dedup.FailureHandler},
		{"plain", errors.New("plain"), dedup.FailureHandler},
		{"not a connection error", fs.ErrNotExist, dedup.FailureHandler},
	}
	for _, c := range cases {
		if got := classify(c.err); got != c.want {
			t.Errorf("%s: Classify(%v) = %q, want %q", c.name, c.err, got, c.want)
		}
	}
	caused := &causedError{err: fmt.Errorf("open: %w", pgErr("25P02")), cause: &pgconn.PgError{Code: "23505", Message: "duplicate key value", ConstraintName: "accounts_pkey"}}
	if got := dedup.ErrorClass(caused); got != "pg:23505:accounts_pkey" || !strings.Contains(caused.Error(), "duplicate key value") || !strings.HasPrefix(caused.Error(), "open: ") {
		t.Errorf("causedError: class %q, text %q: want the cause's class and message", got, caused.Error())
	}
	if !dedup.IsTransient(pgErr("40P01")) || dedup.IsTransient(pgErr("23505")) || dedup.IsTransient(nil) {
		t.Error("IsTransient")
	}
	if !dedup.IsOutcomeUnknown(pgErr("57P01")) || dedup.IsOutcomeUnknown(pgErr("40001")) || dedup.IsOutcomeUnknown(nil) {
		t.Error("IsOutcomeUnknown")
	}
}

// A failed COMMIT: a server error means it did not commit (the handler's
// failure, or transient); anything else leaves the outcome unknown.
func TestCommitFailureClass(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want dedup.FailureClass
	}{
		{"aborted transaction answered ROLLBACK", pgx.ErrTxCommitRollback, dedup.FailureHandler},
		{"deferred unique violation", pgErr("23505"), dedup.FailureHandler},
		{"deferred trigger error", fmt.Errorf("commit: %w", pgErr("P0001")), dedup.FailureHandler},
		{"serialization failure", pgErr("40001"), dedup.FailureTransient},
		{"deadlock", pgErr("40P01"), dedup.FailureTransient},
		{"terminated", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, dedup.FailureOutcomeUnknown},
		{"connection failure", pgErr("08006"), dedup.FailureOutcomeUnknown},
		{"io", io.ErrUnexpectedEOF, dedup.FailureOutcomeUnknown},
		{"context", context.Canceled, dedup.FailureOutcomeUnknown},
		{"anything else that is not a server error", errors.New("weird"), dedup.FailureOutcomeUnknown},
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
		want dedup.FailureClass
	}{
		{"plain", live, errors.New("x"), dedup.FailureHandler},
		{"io error of an HTTP call", live, fmt.Errorf("post: %w", io.ErrUnexpectedEOF), dedup.FailureHandler},
		{"its own deadline", live, fmt.Errorf("call: %w", context.DeadlineExceeded), dedup.FailureHandler},
		{"serialization failure", live, pgErr("40001"), dedup.FailureTransient},
		{"permanent", live, dedup.Permanent(errors.New("x")), dedup.FailurePermanent},
		{"shutdown", ended, errors.New("x"), dedup.FailureOutcomeUnknown},
	}
	for _, c := range cases {
		if got := handlerFailureClass(c.ctx, nil, c.err); got != c.want {
			t.Errorf("%s: handlerFailureClass = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestWrapUnknown(t *testing.T) {
	err := wrapUnknown(io.EOF)
	if !errors.Is(err, dedup.ErrOutcomeUnknown) || !errors.Is(err, io.EOF) {
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
	if p := (RetryPolicy{Disable: true}).withDefaults(defaultTransientRetry); p.tries() != 1 || p.validate("TransientRetry") != nil {
		t.Fatalf("Disable: tries %d (want 1), validate %v", p.tries(), p.validate("TransientRetry"))
	}
	// The old sentinel is refused, naming the field and what to set instead.
	if err := (RetryPolicy{Attempts: -1}).withDefaults(defaultTransientRetry).validate("TransientRetry"); !errors.Is(err, ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "TransientRetry.Attempts") || !strings.Contains(err.Error(), "TransientRetry.Disable") {
		t.Fatalf("negative Attempts: %v", err)
	}
	if err := (RetryPolicy{Disable: true, Attempts: 2}).validate("OutcomeUnknownRetry"); !errors.Is(err, ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "OutcomeUnknownRetry.Disable") {
		t.Fatalf("Disable with Attempts: %v", err)
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
	_, err := retryWhile(context.Background(), fast, log, "t", dedup.IsTransient, func() (int, error) { tries++; return tries, pgErr("40001") })
	if tries != 4 || !dedup.IsTransient(err) {
		t.Fatalf("always transient: %d tries, %v; want 4 and the last error", tries, err)
	}
	tries = 0
	n, err := retryWhile(context.Background(), fast, log, "t", dedup.IsTransient, func() (int, error) {
		tries++
		if tries == 2 {
			return tries, pgErr("23505")
		}
		return tries, pgErr("40001")
	})
	if tries != 2 || n != 2 || dedup.IsTransient(err) || err == nil {
		t.Fatalf("stops at a non-retryable error: %d tries, %v", tries, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tries = 0
	_, err = retryWhile(ctx, RetryPolicy{Attempts: 3, Initial: time.Hour, Max: time.Hour}, log, "t", dedup.IsTransient, func() (int, error) { tries++; return 0, pgErr("40001") })
	if tries != 1 || !errors.Is(err, context.Canceled) {
		t.Fatalf("ctx ended: %d tries, %v", tries, err)
	}
}

func TestConfigTxOptionsAndRetryValidation(t *testing.T) {
	fp, _ := dedup.NewFingerprinter(nil, k1)
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

var k1 = dedup.FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef-one")}
