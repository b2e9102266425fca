package dedup

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

// fakeMarks records what RunLease asked of the store.
type fakeMarks struct {
	fenced           bool
	succeeded, freed int
	failStatus       Status
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
func (f *fakeMarks) Fail(_ context.Context, st Status, reason string, _ error) (int64, bool, error) {
	f.failStatus, f.failReason = st, reason
	return 7, f.fenced, nil
}

func TestRunLeaseOutcomes(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	id := Identity{Scope: "s", MessageID: "m-1"}
	lease := Lease{Identity: id, Record: id, Attempt: 2, Fence: 2}
	opt := LeaseOptions{TTL: time.Minute}
	run := func(ctx context.Context, marks *fakeMarks, maxAttempts int, h LeaseHandler) (Result, error) {
		return RunLease(ctx, &Message{Identity: id}, lease, h, opt, maxAttempts, marks, log)
	}
	ok := func(ctx context.Context, m *Message) error {
		if l, has := LeaseFromContext(ctx); !has || l.Fence != 2 || m.Attempt != 2 {
			return errors.New("handler must see its lease and attempt")
		}
		return nil
	}
	m := &fakeMarks{}
	if r, err := run(context.Background(), m, 5, ok); err != nil || r.Outcome != OutcomeProcessed || m.succeeded != 1 {
		t.Fatalf("success: %+v, %v, marks %+v", r, err, m)
	}
	m = &fakeMarks{fenced: true}
	if r, _ := run(context.Background(), m, 5, ok); r.Outcome != OutcomeFenced || r.Outcome.Acked() {
		t.Fatalf("completion refused: %+v", r)
	}
	m = &fakeMarks{}
	if r, _ := run(context.Background(), m, 5, func(context.Context, *Message) error { return errors.New("x") }); r.Outcome != OutcomeRetry || m.failStatus != StatusFailedRetryable {
		t.Fatalf("retryable: %+v, marks %+v", r, m)
	}
	m = &fakeMarks{}
	if r, _ := run(context.Background(), m, 2, func(context.Context, *Message) error { return errors.New("x") }); r.Outcome != OutcomeDeadLetter || r.DeadLetterID != 7 || m.failReason != ReasonAttemptsExhausted {
		t.Fatalf("last attempt: %+v, marks %+v", r, m)
	}
	m = &fakeMarks{}
	if r, _ := run(context.Background(), m, 5, func(context.Context, *Message) error { return Permanent(errors.New("x")) }); r.Outcome != OutcomeDeadLetter || m.failReason != ReasonPermanentError {
		t.Fatalf("permanent: %+v, marks %+v", r, m)
	}
	m = &fakeMarks{}
	if r, _ := run(context.Background(), m, 5, func(context.Context, *Message) error { panic("boom") }); r.Outcome != OutcomeRetry || !errors.As(r.Err, new(*PanicError)) {
		t.Fatalf("panic: %+v", r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m = &fakeMarks{}
	_, err := run(ctx, m, 5, func(hctx context.Context, _ *Message) error { cancel(); <-hctx.Done(); return hctx.Err() })
	if err == nil || m.freed != 1 || m.failStatus != "" {
		t.Fatalf("shutdown: err %v, marks %+v; want an error and a release, no failure mark", err, m)
	}
	// A renewal that finds another owner cancels the handler with ErrFenced.
	m = &fakeMarks{}
	var cause error
	r, _ := RunLease(context.Background(), &Message{Identity: id}, lease, func(hctx context.Context, _ *Message) error {
		<-hctx.Done()
		cause = context.Cause(hctx)
		return nil
	}, LeaseOptions{TTL: time.Minute, Heartbeat: time.Millisecond}, 5, m, log)
	if r.Outcome != OutcomeFenced || !errors.Is(cause, ErrFenced) || m.succeeded != 0 {
		t.Fatalf("fenced by renewal: %+v, cause %v, marks %+v", r, cause, m)
	}
}
