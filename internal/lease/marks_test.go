package lease

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"

	"github.com/jackc/pgx/v5/pgconn"
)

// errMarks fails every mark with err.
type errMarks struct{ err error }

func (m errMarks) Renew(context.Context) (bool, error) { return true, nil }

func (m errMarks) Succeed(context.Context) (bool, error) { return false, m.err }

func (m errMarks) Release(context.Context) error { return nil }

func (m errMarks) Fail(context.Context, dedup.Status, string, error) (int64, bool, error) {
	return 0, false, m.err
}

// A lease-mode mark that fails leaves the delivery unacked with
// HandlerCalled and Attempts set; a lost connection wraps ErrOutcomeUnknown.
func TestRunMarkErrors(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	id := dedup.Identity{Scope: "s", MessageID: "m-1"}
	lease := dedup.Lease{Identity: id, Record: id, Attempt: 1, Fence: 1}
	opt := dedup.LeaseOptions{TTL: time.Minute, DisableHeartbeat: true}
	for _, h := range []dedup.LeaseHandler{
		func(context.Context, *dedup.Message) error { return nil },
		func(context.Context, *dedup.Message) error { return errors.New("provider said no") },
	} {
		res, err := Run(context.Background(), Params{Message: &dedup.Message{Identity: id}, Lease: lease, Handler: h, Options: opt, MaxAttempts: 1, Marks: errMarks{err: io.ErrUnexpectedEOF}, Logger: log})
		if !errors.Is(err, dedup.ErrOutcomeUnknown) || !res.HandlerCalled || res.Attempts != 1 || res.Outcome != "" {
			t.Fatalf("lost connection: %+v, %v", res, err)
		}
		res, err = Run(context.Background(), Params{Message: &dedup.Message{Identity: id}, Lease: lease, Handler: h, Options: opt, MaxAttempts: 1, Marks: errMarks{err: pgErr("42P01")}, Logger: log})
		if err == nil || errors.Is(err, dedup.ErrOutcomeUnknown) || !res.HandlerCalled {
			t.Fatalf("server error: %+v, %v", res, err)
		}
	}
}

func pgErr(code string) error { return &pgconn.PgError{Severity: "ERROR", Code: code} }
