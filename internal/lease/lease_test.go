package lease

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

// fakeMarks records what Run asked of the store.
type fakeMarks struct {
	fenced           bool
	succeeded, freed int
	failStatus       dedup.Status
	failReason       string
	renewHeld        bool
	renewals         int
}

func (f *fakeMarks) Renew(context.Context) (bool, error) { f.renewals++; return f.renewHeld, nil }
func (f *fakeMarks) Succeed(context.Context) (bool, error) {
	f.succeeded++
	return f.fenced, nil
}
func (f *fakeMarks) Release(context.Context) error { f.freed++; return nil }
func (f *fakeMarks) Fail(_ context.Context, st dedup.Status, reason string, _ error) (int64, bool, error) {
	f.failStatus, f.failReason = st, reason
	return 7, f.fenced, nil
}

func TestRunOutcomes(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	id := dedup.Identity{Scope: "s", MessageID: "m-1"}
	lease := dedup.Lease{Identity: id, Record: id, Attempt: 2, Fence: 2}
	opt := dedup.LeaseOptions{TTL: time.Minute}
	run := func(ctx context.Context, marks *fakeMarks, maxAttempts int, h dedup.LeaseHandler) (dedup.Result, error) {
		return Run(ctx, Params{Message: &dedup.Message{Identity: id}, Lease: lease, Handler: h, Options: opt, MaxAttempts: maxAttempts, Marks: marks, Logger: log})
	}
	ok := func(ctx context.Context, m *dedup.Message) error {
		if l, has := dedup.LeaseFromContext(ctx); !has || l.Fence != 2 || m.Attempt != 2 {
			return errors.New("handler must see its lease and attempt")
		}
		return nil
	}
	m := &fakeMarks{}
	if r, err := run(context.Background(), m, 5, ok); err != nil || r.Outcome != dedup.OutcomeProcessed || m.succeeded != 1 {
		t.Fatalf("success: %+v, %v, marks %+v", r, err, m)
	}
	m = &fakeMarks{fenced: true}
	if r, _ := run(context.Background(), m, 5, ok); r.Outcome != dedup.OutcomeFenced || r.Outcome.Acked() {
		t.Fatalf("completion refused: %+v", r)
	}
	m = &fakeMarks{}
	if r, _ := run(context.Background(), m, 5, func(context.Context, *dedup.Message) error { return errors.New("x") }); r.Outcome != dedup.OutcomeRetry || m.failStatus != dedup.StatusFailedRetryable {
		t.Fatalf("retryable: %+v, marks %+v", r, m)
	}
	m = &fakeMarks{}
	if r, _ := run(context.Background(), m, 2, func(context.Context, *dedup.Message) error { return errors.New("x") }); r.Outcome != dedup.OutcomeDeadLetter || r.DeadLetterID != 7 || m.failReason != dedup.ReasonAttemptsExhausted {
		t.Fatalf("last attempt: %+v, marks %+v", r, m)
	}
	m = &fakeMarks{}
	if r, _ := run(context.Background(), m, 5, func(context.Context, *dedup.Message) error { return dedup.Permanent(errors.New("x")) }); r.Outcome != dedup.OutcomeDeadLetter || m.failReason != dedup.ReasonPermanentError {
		t.Fatalf("permanent: %+v, marks %+v", r, m)
	}
	m = &fakeMarks{}
	if r, _ := run(context.Background(), m, 5, func(context.Context, *dedup.Message) error { panic("boom") }); r.Outcome != dedup.OutcomeRetry || !errors.As(r.Err, new(*dedup.PanicError)) {
		t.Fatalf("panic: %+v", r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m = &fakeMarks{}
	_, err := run(ctx, m, 5, func(hctx context.Context, _ *dedup.Message) error { cancel(); <-hctx.Done(); return hctx.Err() })
	if err == nil || m.freed != 1 || m.failStatus != "" {
		t.Fatalf("shutdown: err %v, marks %+v; want an error and a release, no failure mark", err, m)
	}
	// A renewal that finds another owner cancels the handler with ErrFenced.
	m = &fakeMarks{}
	var cause error
	r, _ := Run(context.Background(), Params{
		Message: &dedup.Message{Identity: id}, Lease: lease,
		Handler: func(hctx context.Context, _ *dedup.Message) error {
			<-hctx.Done()
			cause = context.Cause(hctx)
			return nil
		},
		Options: dedup.LeaseOptions{TTL: time.Minute, Heartbeat: time.Millisecond}, MaxAttempts: 5, Marks: m, Logger: log,
	})
	if r.Outcome != dedup.OutcomeFenced || !errors.Is(cause, dedup.ErrFenced) || m.succeeded != 0 {
		t.Fatalf("fenced by renewal: %+v, cause %v, marks %+v", r, cause, m)
	}
}
