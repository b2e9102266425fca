package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

// scope is the scope of every delivery of the suite (each case has a store
// of its own).
const scope = "storetest"

// Run runs the conformance suite against the store newStore builds, in the
// mode its Harness names: one parallel subtest per case, each on a fresh
// store from newStore. Cases a store cannot take part in (f), and cases that
// do not apply to the mode (the lease cases outside lease mode, BatchInOrder
// outside batched mode), are not run: Run builds one harness first to learn
// the mode, registers only the cases that apply, and logs the others once
// with the feature or mode that excludes them.
//
// The cases:
//
//   - ClaimAndSuccess: a new message runs once, is SUCCEEDED with attempts
//     1 and a retention expiry, and is acked.
//   - DuplicateByMessageID: a redelivery is a duplicate by message ID, the
//     handler not run.
//   - DuplicateByBusinessKey: a producer re-send under a new message ID with
//     the same business key and payload is a duplicate by business key and
//     gets no record of its own.
//   - Conflict: the same message ID or business key with another payload is
//     not applied, acked, and dead-lettered whole with the reason of its kind
//     (payload_conflict, message_id_collision); a repeated copy of the same
//     conflict writes no second dead letter.
//   - Retry: a failure is FAILED_RETRYABLE, not acked, its attempt counted
//     and its error kept; the redelivery runs again and succeeds.
//   - FinalFailure: MaxAttempts failures, or one Permanent error (or one
//     whose Permanent() bool method returns true), make the
//     record FAILED_FINAL with a dead letter holding the payload (reasons
//     attempts_exhausted, permanent_error); a copy of a final record is an
//     acked duplicate, the handler not run.
//   - Redrive: a re-driven FAILED_FINAL record runs its next copy once more
//     (attempt MaxAttempts+1); Redrive of a record that is not final, or of
//     none, fails with ErrNotFinal or ErrNotFound.
//   - LeaseTakeoverAndFencing (lease mode): a copy during a live lease is
//     not acked (ErrLeaseHeld); once the lease expired a copy takes over
//     with a new owner token and the fence plus one, under the same
//     idempotency key, and the stale owner's success or failure is refused
//     (OutcomeFenced, ErrFenced, not acked).
//   - RenewalFindsTakeover (lease mode): an owner whose renewal finds the
//     record taken over has its context canceled with ErrFenced at once,
//     not at its lease's end.
//   - HeartbeatKeepsLease (lease mode): heartbeats keep a 1 s lease held
//     through a handler that runs past 2 s: every copy meanwhile is not
//     acked (ErrLeaseHeld) and nobody takes over.
//   - IdempotencyKeyAcrossResend (lease mode): a re-send under a new
//     message ID that takes over a failed record by business key runs as
//     its next attempt with the record's idempotency key, the one the first
//     execution sent downstream.
//   - RejectBadInput: Reject dead-letters bad input whole (bad_input)
//     without a handler run; a copy is a duplicate; the rejected message's
//     business key makes another payload a conflict; rejecting a re-send of
//     a SUCCEEDED message is a duplicate by business key; in lease mode a
//     record held by a live lease is not rejected (retry) until the lease
//     expired.
//   - InterruptedHandler: a handler interrupted by a shutdown (its ctx
//     canceled) is not acked and its attempt is not counted (lease mode
//     gives the lease back; atomic modes roll the claim back); the next copy
//     runs as attempt 1.
//   - CrashLoop: executions that never report an outcome are counted and
//     the attempts cap holds: in lease mode, owners that die holding the
//     lease (expired by ExpireLease) until the next copy is dead-lettered
//     with ErrExecutionLost, the handler not run; in atomic and batched
//     modes, start markers (StartMarker) whose runs died.
//   - ConcurrentCopies: 20 copies of one message at once (lease-held copies
//     redelivered until acked): exactly one handler effect, one processed
//     and 19 duplicates, one record.
//   - RetentionPurge: a record past its retention is purged (ExpireRecord,
//     then Purge) and a redelivery of it runs as new; records whose
//     retention runs, and records not final, stay.
//   - PurgeMeetsCopies (S27): a processed message's record past its
//     retention; eight copies and the purge (Purge, or the store's own
//     expiry) released together, then two more copies: every copy is
//     processed, a duplicate or (lease mode) held, never an error; exactly
//     one new handler effect; the last copy is a duplicate of it.
//   - BatchInOrder (batched mode): one batch with a message, its copy, a
//     conflicting copy and a failing message gets the per-message outcomes
//     in order.
//
// Every case runs as a parallel subtest (t.Parallel) on its own store; a
// case needs at most a few seconds (HeartbeatKeepsLease about 2.5 s of
// real time, the others wait on conditions only).
func Run(t *testing.T, f Features, newStore func(t *testing.T) Harness) {
	t.Helper()
	noLease := func(_ Features, h Harness) string {
		if !h.Mode.Lease {
			return "mode " + h.Mode.Name + " has no lease (the store's lease-mode run covers it)"
		}
		return ""
	}
	cases := []struct {
		name string
		run  func(t *testing.T, f Features, h Harness)
		// skip says why the case does not apply to the store's features
		// or mode ("" when it applies); such a case is not run at all.
		skip func(f Features, h Harness) string
	}{
		{"ClaimAndSuccess", testClaimAndSuccess, nil},
		{"DuplicateByMessageID", testDuplicateByMessageID, nil},
		{"DuplicateByBusinessKey", testDuplicateByBusinessKey, nil},
		{"Conflict", testConflict, nil},
		{"Retry", testRetry, nil},
		{"FinalFailure", testFinalFailure, nil},
		{"Redrive", testRedrive, func(f Features, _ Harness) string {
			if f.NoRedrive {
				return "feature NoRedrive: the store has no operator re-drive"
			}
			return ""
		}},
		{"LeaseTakeoverAndFencing", testLeaseTakeover, noLease},
		{"RenewalFindsTakeover", testRenewalFindsTakeover, noLease},
		{"HeartbeatKeepsLease", testHeartbeat, noLease},
		{"IdempotencyKeyAcrossResend", testIdempotencyKeyAcrossResend, noLease},
		{"RejectBadInput", testReject, nil},
		{"InterruptedHandler", testInterrupted, nil},
		{"CrashLoop", testCrashLoop, func(f Features, h Harness) string {
			if _, ok := h.Store.(StartMarker); !h.Mode.Lease && (f.NoStartMarkers || !ok) {
				return "feature NoStartMarkers: in mode " + h.Mode.Name + " the store does not bound handlers that kill their process"
			}
			return ""
		}},
		{"ConcurrentCopies", testConcurrentCopies, nil},
		{"RetentionPurge", testRetentionPurge, func(f Features, h Harness) string {
			if f.NoPurge || h.ExpireRecord == nil {
				return "feature NoPurge: the store keeps records forever"
			}
			return ""
		}},
		{"PurgeMeetsCopies", testPurgeMeetsCopies, func(f Features, h Harness) string {
			if f.NoPurge || h.ExpireRecord == nil {
				return "feature NoPurge: the store keeps records forever"
			}
			return ""
		}},
		{"BatchInOrder", testBatchInOrder, func(_ Features, h Harness) string {
			if h.Mode.Batch == nil {
				return "mode " + h.Mode.Name + " takes one delivery per call (the store's batched-mode run covers batches)"
			}
			return ""
		}},
	}
	// One harness, built first, tells which cases apply: a case that does
	// not is not registered (no SKIP line in CI), and the run says so once.
	probe := newStore(t)
	if err := probe.validate(); err != nil {
		t.Fatal(err)
	}
	var notRun []string
	for _, c := range cases {
		if c.skip != nil {
			if why := c.skip(f, probe); why != "" {
				notRun = append(notRun, c.name+" ("+why+")")
				continue
			}
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newStore(t)
			if err := h.validate(); err != nil {
				t.Fatal(err)
			}
			c.run(t, f, h)
		})
	}
	if len(notRun) > 0 {
		t.Logf("cases that do not apply to this store, not run: %s", strings.Join(notRun, "; "))
	}
}

// ---------------------------------------------------------------------------
// Helpers.

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newMsg builds a delivery of the suite's scope with a normalized identity.
func newMsg(t *testing.T, messageID, businessKey, payload string) *dedup.Message {
	t.Helper()
	id, err := dedup.NewIdentity(scope, messageID, "", businessKey)
	if err != nil {
		t.Fatal(err)
	}
	return &dedup.Message{Identity: id, Topic: "payments", Key: []byte("k-" + messageID), Payload: []byte(payload),
		Headers: map[string]string{"storetest-header": "h-" + messageID}, Source: "storetest:" + messageID}
}

// counter is a Handler spy: calls counts every run, effects every run that
// returned nil (the handler's effect applied).
type counter struct {
	calls, effects atomic.Int64
	fail           func(call int64, m *dedup.Message) error // nil: succeed
}

func (c *counter) handle(_ context.Context, m *dedup.Message) error {
	n := c.calls.Add(1)
	if c.fail != nil {
		if err := c.fail(n, m); err != nil {
			return err
		}
	}
	c.effects.Add(1)
	return nil
}

func mustNotRun(t *testing.T) Handler {
	return func(_ context.Context, m *dedup.Message) error {
		t.Errorf("handler ran for %s; want no run", m.Identity)
		return errors.New("storetest: handler must not run")
	}
}

func process(t *testing.T, h Harness, m *dedup.Message, hd Handler) dedup.Result {
	t.Helper()
	res, err := h.Mode.Process(ctxOf(t), m, hd)
	if err != nil {
		t.Fatalf("%s %s: %v", h.Mode.Name, m.Identity, err)
	}
	return res
}

func lookup(t *testing.T, h Harness, messageID string) dedup.Record {
	t.Helper()
	r, err := h.Admin.Lookup(ctxOf(t), scope, messageID)
	if err != nil {
		t.Fatalf("Lookup %s: %v", messageID, err)
	}
	return r
}

func deadLetters(t *testing.T, h Harness) []dedup.DeadLetter {
	t.Helper()
	dl, err := h.Admin.DeadLetters(ctxOf(t), scope, 0, 1000)
	if err != nil {
		t.Fatalf("DeadLetters: %v", err)
	}
	return dl
}

// eventually polls cond every 20 ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkDeadLetter checks a dead letter keeps the delivery whole.
func checkDeadLetter(t *testing.T, d dedup.DeadLetter, m *dedup.Message, reason string) {
	t.Helper()
	if d.Reason != reason || d.MessageID != m.Identity.MessageID || d.BusinessKey != m.Identity.BusinessKey || d.Topic != m.Topic ||
		string(d.Payload) != string(m.Payload) || d.Headers["storetest-header"] != m.Headers["storetest-header"] || d.ID == 0 {
		t.Fatalf("dead letter = %+v; want reason %s with the delivery %s (payload %q) kept whole", d, reason, m.Identity, m.Payload)
	}
}

// ---------------------------------------------------------------------------
// Cases.

func testClaimAndSuccess(t *testing.T, _ Features, h Harness) {
	c := &counter{}
	m := newMsg(t, "m-1", "pay-1", `{"amount":40}`)
	var attempt int
	res := process(t, h, m, func(ctx context.Context, m *dedup.Message) error {
		attempt = m.Attempt
		return c.handle(ctx, m)
	})
	if res.Outcome != dedup.OutcomeProcessed || !res.Outcome.Acked() || !res.HandlerCalled || res.Status != dedup.StatusSucceeded || res.Attempts != 1 || res.Err != nil {
		t.Fatalf("result = %+v; want processed, SUCCEEDED, attempt 1", res)
	}
	if attempt != 1 || c.effects.Load() != 1 {
		t.Fatalf("handler saw attempt %d, effects %d; want 1 and 1", attempt, c.effects.Load())
	}
	r := lookup(t, h, "m-1")
	if r.Status != dedup.StatusSucceeded || r.Attempts != 1 || r.MessageID != "m-1" || r.BusinessKey != "pay-1" || r.Scope != scope || r.ExpiresAt == nil {
		t.Fatalf("record = %+v; want SUCCEEDED, attempts 1, with its identity and an expiry", r)
	}
	if left := time.Until(*r.ExpiresAt); left < h.Store.SucceededRetention()-time.Minute || left > h.Store.SucceededRetention()+time.Minute {
		t.Fatalf("record expires in %s; want about SucceededRetention %s", left, h.Store.SucceededRetention())
	}
	if dl := deadLetters(t, h); len(dl) != 0 {
		t.Fatalf("dead letters = %+v; want none", dl)
	}
}

func testDuplicateByMessageID(t *testing.T, _ Features, h Harness) {
	c := &counter{}
	if res := process(t, h, newMsg(t, "m-1", "", "x"), c.handle); res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("first copy: %+v", res)
	}
	for i := range 3 {
		res := process(t, h, newMsg(t, "m-1", "", "x"), mustNotRun(t))
		if res.Outcome != dedup.OutcomeDuplicate || res.MatchedBy != dedup.ByMessageID || res.HandlerCalled || !res.Outcome.Acked() || res.Status != dedup.StatusSucceeded {
			t.Fatalf("copy %d: %+v; want an acked duplicate by message ID, handler not run", i+2, res)
		}
	}
	if r := lookup(t, h, "m-1"); r.Status != dedup.StatusSucceeded || r.Attempts != 1 {
		t.Fatalf("record = %+v; want SUCCEEDED with 1 attempt", r)
	}
	if c.effects.Load() != 1 {
		t.Fatalf("effects = %d; want 1", c.effects.Load())
	}
}

func testDuplicateByBusinessKey(t *testing.T, _ Features, h Harness) {
	c := &counter{}
	if res := process(t, h, newMsg(t, "m-1", "pay-1", `{"amount":40}`), c.handle); res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("first message: %+v", res)
	}
	res := process(t, h, newMsg(t, "m-2", "pay-1", `{"amount":40}`), mustNotRun(t))
	if res.Outcome != dedup.OutcomeDuplicate || res.MatchedBy != dedup.ByBusinessKey || res.HandlerCalled || !res.Outcome.Acked() {
		t.Fatalf("re-send under a new message ID: %+v; want an acked duplicate by business key", res)
	}
	if _, err := h.Admin.Lookup(ctxOf(t), scope, "m-2"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("Lookup of the re-send: %v; want ErrNotFound (no record of its own)", err)
	}
	// A message without a business key never matches by business key.
	if res := process(t, h, newMsg(t, "m-3", "", `{"amount":40}`), c.handle); res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("same payload, no business key: %+v; want processed", res)
	}
	if c.effects.Load() != 2 {
		t.Fatalf("effects = %d; want 2", c.effects.Load())
	}
}

func testConflict(t *testing.T, _ Features, h Harness) {
	c := &counter{}
	if res := process(t, h, newMsg(t, "m-1", "pay-1", `{"amount":40}`), c.handle); res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("first message: %+v", res)
	}
	check := func(m *dedup.Message, by dedup.MatchedBy, reason string, kind error, newDeadLetter bool) dedup.Result {
		t.Helper()
		res := process(t, h, m, mustNotRun(t))
		if res.Outcome != dedup.OutcomeConflict || res.MatchedBy != by || res.Reason != reason || !res.Outcome.Acked() || res.HandlerCalled ||
			!errors.Is(res.Err, dedup.ErrFingerprintConflict) || !errors.Is(res.Err, kind) || (res.DeadLetterID != 0) != newDeadLetter {
			t.Fatalf("%s (payload %s): %+v; want an acked conflict by %s, reason %s, new dead letter %v", m.Identity, m.Payload, res, by, reason, newDeadLetter)
		}
		return res
	}
	payload := newMsg(t, "m-1", "pay-1", `{"amount":45}`)
	first := check(payload, dedup.ByMessageID, dedup.ReasonPayloadConflict, dedup.ErrPayloadConflict, true)
	check(newMsg(t, "m-1", "pay-1", `{"amount":45}`), dedup.ByMessageID, dedup.ReasonPayloadConflict, dedup.ErrPayloadConflict, false)
	byKey := newMsg(t, "m-2", "pay-1", `{"amount":99}`)
	second := check(byKey, dedup.ByBusinessKey, dedup.ReasonPayloadConflict, dedup.ErrPayloadConflict, true)
	collision := newMsg(t, "m-1", "other-9", `{"other":true}`)
	third := check(collision, dedup.ByMessageID, dedup.ReasonMessageIDCollision, dedup.ErrMessageIDCollision, true)
	if c.effects.Load() != 1 {
		t.Fatalf("effects = %d; want 1 (no conflict applied)", c.effects.Load())
	}
	if r := lookup(t, h, "m-1"); r.Status != dedup.StatusSucceeded || r.BusinessKey != "pay-1" || r.Attempts != 1 {
		t.Fatalf("record = %+v; want the first message's, untouched", r)
	}
	dl := deadLetters(t, h)
	if len(dl) != 3 {
		t.Fatalf("dead letters = %+v; want 3 (one per distinct conflict)", dl)
	}
	checkDeadLetter(t, dl[0], payload, dedup.ReasonPayloadConflict)
	checkDeadLetter(t, dl[1], byKey, dedup.ReasonPayloadConflict)
	checkDeadLetter(t, dl[2], collision, dedup.ReasonMessageIDCollision)
	if dl[0].ID != first.DeadLetterID || dl[1].ID != second.DeadLetterID || dl[2].ID != third.DeadLetterID {
		t.Fatalf("dead letter IDs %d %d %d; results said %d %d %d", dl[0].ID, dl[1].ID, dl[2].ID, first.DeadLetterID, second.DeadLetterID, third.DeadLetterID)
	}
	if rest, err := h.Admin.DeadLetters(ctxOf(t), scope, dl[0].ID, 10); err != nil || len(rest) != 2 || rest[0].ID != dl[1].ID {
		t.Fatalf("dead letters after %d = %+v, %v; want the last 2", dl[0].ID, rest, err)
	}
}

func testRetry(t *testing.T, _ Features, h Harness) {
	c := &counter{fail: func(n int64, _ *dedup.Message) error {
		if n <= 2 {
			return fmt.Errorf("provider timeout %d", n)
		}
		return nil
	}}
	m := newMsg(t, "m-1", "", "x")
	for i := 1; i <= 2; i++ {
		res := process(t, h, m, c.handle)
		if res.Outcome != dedup.OutcomeRetry || res.Outcome.Acked() || res.Attempts != i || res.Status != dedup.StatusFailedRetryable || !res.HandlerCalled ||
			res.Err == nil || !strings.Contains(res.Err.Error(), "provider timeout") {
			t.Fatalf("copy %d: %+v; want retry (not acked), attempts %d, FAILED_RETRYABLE, the handler's error", i, res, i)
		}
		if r := lookup(t, h, "m-1"); r.Status != dedup.StatusFailedRetryable || r.Attempts != i || !strings.Contains(r.LastError, fmt.Sprintf("provider timeout %d", i)) || r.ExpiresAt != nil && time.Until(*r.ExpiresAt) < time.Hour {
			t.Fatalf("record after failure %d = %+v; want FAILED_RETRYABLE, attempts %d, the error kept", i, r, i)
		}
	}
	var attempt int
	res := process(t, h, m, func(ctx context.Context, m *dedup.Message) error {
		attempt = m.Attempt
		return c.handle(ctx, m)
	})
	if res.Outcome != dedup.OutcomeProcessed || res.Attempts != 3 || attempt != 3 {
		t.Fatalf("third copy: %+v, handler saw attempt %d; want processed at attempt 3", res, attempt)
	}
	if r := lookup(t, h, "m-1"); r.Status != dedup.StatusSucceeded || r.Attempts != 3 {
		t.Fatalf("record = %+v; want SUCCEEDED after 3 attempts", r)
	}
	if c.calls.Load() != 3 || c.effects.Load() != 1 || len(deadLetters(t, h)) != 0 {
		t.Fatalf("calls %d, effects %d, dead letters %d; want 3, 1, 0", c.calls.Load(), c.effects.Load(), len(deadLetters(t, h)))
	}
}

func testFinalFailure(t *testing.T, _ Features, h Harness) {
	maxAttempts := h.Store.MaxAttempts()
	c := &counter{fail: func(_ int64, m *dedup.Message) error {
		switch m.Identity.MessageID {
		case "m-bad":
			return dedup.Permanent(errors.New("card declined"))
		case "m-illegal":
			return fmt.Errorf("handler: %w", selfPermanentError{})
		}
		return errors.New("always fails")
	}}
	poison := newMsg(t, "m-poison", "pay-p", "p-poison")
	for i := 1; i <= maxAttempts; i++ {
		res := process(t, h, poison, c.handle)
		want := dedup.OutcomeRetry
		if i == maxAttempts {
			want = dedup.OutcomeDeadLetter
		}
		if res.Outcome != want || res.Attempts != i {
			t.Fatalf("m-poison copy %d: %+v; want %s at attempt %d", i, res, want, i)
		}
		if i == maxAttempts && (res.Status != dedup.StatusFailedFinal || res.Reason != dedup.ReasonAttemptsExhausted || res.DeadLetterID == 0 || !res.Outcome.Acked()) {
			t.Fatalf("last attempt: %+v; want FAILED_FINAL, an acked dead letter attempts_exhausted", res)
		}
	}
	bad := newMsg(t, "m-bad", "", "p-bad")
	res := process(t, h, bad, c.handle)
	if res.Outcome != dedup.OutcomeDeadLetter || res.Attempts != 1 || res.Reason != dedup.ReasonPermanentError || res.DeadLetterID == 0 || !dedup.IsPermanent(res.Err) {
		t.Fatalf("permanent error: %+v; want a dead letter permanent_error at attempt 1", res)
	}
	// An error that says so itself (a Permanent() bool method, as
	// transition.IllegalTransitionError for a move the entity can never
	// make) is permanent too.
	illegal := newMsg(t, "m-illegal", "", "p-illegal")
	res = process(t, h, illegal, c.handle)
	if res.Outcome != dedup.OutcomeDeadLetter || res.Attempts != 1 || res.Reason != dedup.ReasonPermanentError || res.DeadLetterID == 0 {
		t.Fatalf("an error whose Permanent() is true: %+v; want a dead letter permanent_error at attempt 1", res)
	}
	// Copies of final records are acked without a run.
	for _, m := range []*dedup.Message{poison, bad, illegal} {
		res := process(t, h, m, mustNotRun(t))
		if res.Outcome != dedup.OutcomeDuplicate || res.Status != dedup.StatusFailedFinal || res.HandlerCalled || !res.Outcome.Acked() {
			t.Fatalf("copy of final %s: %+v; want an acked duplicate, FAILED_FINAL, no run", m.Identity, res)
		}
	}
	if r := lookup(t, h, "m-poison"); r.Status != dedup.StatusFailedFinal || r.Attempts != maxAttempts || !strings.Contains(r.LastError, "always fails") {
		t.Fatalf("m-poison record = %+v", r)
	}
	if r := lookup(t, h, "m-bad"); r.Status != dedup.StatusFailedFinal || r.Attempts != 1 || !strings.Contains(r.LastError, "card declined") {
		t.Fatalf("m-bad record = %+v", r)
	}
	if r := lookup(t, h, "m-illegal"); r.Status != dedup.StatusFailedFinal || r.Attempts != 1 || r.LastErrorClass != "permanent:error" {
		t.Fatalf("m-illegal record = %+v; want FAILED_FINAL at attempt 1, class permanent:error", r)
	}
	dl := deadLetters(t, h)
	if len(dl) != 3 {
		t.Fatalf("dead letters = %+v; want 3", dl)
	}
	checkDeadLetter(t, dl[0], poison, dedup.ReasonAttemptsExhausted)
	checkDeadLetter(t, dl[1], bad, dedup.ReasonPermanentError)
	checkDeadLetter(t, dl[2], illegal, dedup.ReasonPermanentError)
	if dl[0].Attempts != maxAttempts || !strings.Contains(dl[0].Error, "always fails") || dl[1].Attempts != 1 || !strings.Contains(dl[1].Error, "card declined") {
		t.Fatalf("dead letters = %+v; want attempts and errors kept", dl)
	}
	if n := c.calls.Load(); n != int64(maxAttempts)+2 {
		t.Fatalf("handler calls = %d; want %d", n, maxAttempts+2)
	}
}

// selfPermanentError says by itself that retrying cannot help, as errors
// of packages that import nothing of idemq do (dedup.IsPermanent).
type selfPermanentError struct{}

func (selfPermanentError) Error() string   { return "can never happen from here" }
func (selfPermanentError) Permanent() bool { return true }

func testRedrive(t *testing.T, f Features, h Harness) {
	if f.NoRedrive {
		t.Skip("feature NoRedrive: the store has no operator re-drive")
	}
	ctx := ctxOf(t)
	maxAttempts := h.Store.MaxAttempts()
	fail := true
	c := &counter{fail: func(int64, *dedup.Message) error {
		if fail {
			return errors.New("downstream broken")
		}
		return nil
	}}
	m := newMsg(t, "m-1", "", "x")
	for range maxAttempts {
		process(t, h, m, c.handle)
	}
	if r := lookup(t, h, "m-1"); r.Status != dedup.StatusFailedFinal {
		t.Fatalf("record = %+v; want FAILED_FINAL", r)
	}
	if err := h.Admin.Redrive(ctx, scope, "m-1"); err != nil {
		t.Fatalf("Redrive: %v", err)
	}
	if r := lookup(t, h, "m-1"); r.Status != dedup.StatusFailedRetryable {
		t.Fatalf("record after Redrive = %+v; want FAILED_RETRYABLE", r)
	}
	fail = false
	res := process(t, h, m, c.handle)
	if res.Outcome != dedup.OutcomeProcessed || res.Attempts != maxAttempts+1 || c.effects.Load() != 1 {
		t.Fatalf("copy after the re-drive: %+v, effects %d; want processed at attempt %d", res, c.effects.Load(), maxAttempts+1)
	}
	if res := process(t, h, m, mustNotRun(t)); res.Outcome != dedup.OutcomeDuplicate {
		t.Fatalf("copy after the re-driven run: %+v; want a duplicate", res)
	}
	if dl := deadLetters(t, h); len(dl) != 1 {
		t.Fatalf("dead letters = %+v; want the one, kept", dl)
	}
	if err := h.Admin.Redrive(ctx, scope, "m-1"); !errors.Is(err, dedup.ErrNotFinal) {
		t.Fatalf("Redrive of a SUCCEEDED record = %v; want ErrNotFinal", err)
	}
	if err := h.Admin.Redrive(ctx, scope, "m-none"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("Redrive of no record = %v; want ErrNotFound", err)
	}
}

// owner is a lease-mode execution the test holds: it claims, reports its
// lease and waits for release before returning ret.
type owner struct {
	lease   chan dedup.Lease
	release chan error
	done    chan ownerResult
}

type ownerResult struct {
	res dedup.Result
	err error
}

func startOwner(t *testing.T, h Harness, m *dedup.Message, opt dedup.LeaseOptions) *owner {
	t.Helper()
	o := &owner{lease: make(chan dedup.Lease, 1), release: make(chan error, 1), done: make(chan ownerResult, 1)}
	go func() {
		res, err := h.Store.ProcessLeased(context.Background(), m, func(ctx context.Context, _ *dedup.Message) error {
			l, _ := dedup.LeaseFromContext(ctx)
			o.lease <- l
			return <-o.release
		}, opt)
		o.done <- ownerResult{res, err}
	}()
	select {
	case l := <-o.lease:
		o.lease <- l
	case r := <-o.done:
		t.Fatalf("owner of %s returned before running: %+v, %v", m.Identity, r.res, r.err)
	case <-time.After(time.Minute):
		t.Fatalf("owner of %s never ran", m.Identity)
	}
	return o
}

func (o *owner) held() dedup.Lease { l := <-o.lease; o.lease <- l; return l }

func (o *owner) finish(t *testing.T, ret error) ownerResult {
	t.Helper()
	o.release <- ret
	select {
	case r := <-o.done:
		return r
	case <-time.After(time.Minute):
		t.Fatal("a released owner did not return")
		return ownerResult{}
	}
}

// stalled is the lease of an owner that stalls: a TTL far longer than the
// case, no heartbeats (the lease ends only by ExpireLease).
var stalled = dedup.LeaseOptions{TTL: 5 * time.Minute, DisableHeartbeat: true}

func testLeaseTakeover(t *testing.T, _ Features, h Harness) {
	if !h.Mode.Lease {
		t.Skipf("mode %s has no lease (the lease-mode run of the store covers it)", h.Mode.Name)
	}
	ctx := ctxOf(t)
	for _, ret := range []error{nil, errors.New("provider failed")} {
		id := "m-ok"
		if ret != nil {
			id = "m-fail"
		}
		t.Run(id, func(t *testing.T) {
			m := newMsg(t, id, "charge-"+id, "x")
			a := startOwner(t, h, m, stalled)
			la := a.held()
			if la.Fence < 1 || la.Attempt != 1 || la.OwnerToken.String() == "" {
				t.Fatalf("A's lease = %+v", la)
			}
			early, err := h.Store.ProcessLeased(ctx, m, dedup.LeaseHandler(mustNotRun(t)), stalled)
			if err != nil || early.Outcome != dedup.OutcomeRetry || early.Outcome.Acked() || !errors.Is(early.Err, dedup.ErrLeaseHeld) || early.HandlerCalled {
				t.Fatalf("copy during A's live lease: %+v, %v; want retry on ErrLeaseHeld, not acked", early, err)
			}
			if err := h.ExpireLease(ctx, scope, id); err != nil {
				t.Fatalf("ExpireLease: %v", err)
			}
			// B takes over and holds the record while A, the stale owner,
			// finishes: A's mark is refused by owner token and fence alone.
			b := startOwner(t, h, m, stalled)
			lb := b.held()
			if lb.Fence != la.Fence+1 || lb.OwnerToken == la.OwnerToken || lb.IdempotencyKey() != la.IdempotencyKey() || lb.Attempt != 2 {
				t.Fatalf("leases A %+v, B %+v; want B's fence A's+1, a new owner token, the same idempotency key, attempt 2", la, lb)
			}
			r := a.finish(t, ret)
			if r.err != nil || r.res.Outcome != dedup.OutcomeFenced || !errors.Is(r.res.Err, dedup.ErrFenced) || r.res.Outcome.Acked() {
				t.Fatalf("stale owner A returning %v: %+v, %v; want fenced, not acked", ret, r.res, r.err)
			}
			if rec := lookup(t, h, id); rec.Status != dedup.StatusProcessing || rec.Fence != lb.Fence || rec.Attempts != 2 {
				t.Fatalf("record after A's refused mark = %+v; want B's PROCESSING, fence %d, attempts 2", rec, lb.Fence)
			}
			if rb := b.finish(t, nil); rb.err != nil || rb.res.Outcome != dedup.OutcomeProcessed || rb.res.Attempts != 2 {
				t.Fatalf("B: %+v, %v; want processed at attempt 2", rb.res, rb.err)
			}
			rec := lookup(t, h, id)
			if rec.Status != dedup.StatusSucceeded || rec.Fence != lb.Fence || rec.Attempts != 2 {
				t.Fatalf("record = %+v; want B's: SUCCEEDED, fence %d, attempts 2", rec, lb.Fence)
			}
		})
	}
	if dl := deadLetters(t, h); len(dl) != 0 {
		t.Fatalf("dead letters = %+v; want none (a fenced failure writes nothing)", dl)
	}
}

func testInterrupted(t *testing.T, _ Features, h Harness) {
	sctx, cancel := context.WithCancel(ctxOf(t))
	m := newMsg(t, "m-1", "", "x")
	res, err := h.Mode.Process(sctx, m, func(ctx context.Context, _ *dedup.Message) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if err == nil {
		t.Fatalf("interrupted handler: %+v with no error; want an error (not acked)", res)
	}
	// Lease mode gives the lease back; atomic modes roll the claim back.
	r, err := h.Admin.Lookup(ctxOf(t), scope, "m-1")
	if err != nil && !errors.Is(err, dedup.ErrNotFound) || err == nil && (r.Status != dedup.StatusFailedRetryable || r.Attempts != 0) {
		t.Fatalf("record after the shutdown = %+v, %v; want none, or FAILED_RETRYABLE with the attempt not counted", r, err)
	}
	c := &counter{}
	if res := process(t, h, m, c.handle); res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 {
		t.Fatalf("next copy: %+v; want processed at attempt 1", res)
	}
}

func testCrashLoop(t *testing.T, f Features, h Harness) {
	if h.Mode.Lease {
		crashLoopLease(t, h)
		return
	}
	sm, ok := h.Store.(StartMarker)
	if f.NoStartMarkers || !ok {
		t.Skipf("feature NoStartMarkers: in mode %s the store does not bound handlers that kill their process (implements StartMarker: %v)", h.Mode.Name, ok)
	}
	crashLoopMarkers(t, h, sm)
}

// crashLoopLease: every owner dies holding the lease (never returns) and
// its lease expires; each takeover counts an attempt; once MaxAttempts
// owners died, the next copy is dead-lettered without a run.
func crashLoopLease(t *testing.T, h Harness) {
	ctx := ctxOf(t)
	maxAttempts := h.Store.MaxAttempts()
	m := newMsg(t, "m-kill", "", "big")
	var owners []*owner
	t.Cleanup(func() { // the dead owners return at the end, fenced
		for _, o := range owners {
			o.finish(t, nil)
		}
	})
	for i := 1; i <= maxAttempts; i++ {
		o := startOwner(t, h, m, stalled)
		owners = append(owners, o)
		if l := o.held(); l.Attempt != i {
			t.Fatalf("owner %d runs attempt %d; want %d (a dead owner's run counts)", i, l.Attempt, i)
		}
		if err := h.ExpireLease(ctx, scope, "m-kill"); err != nil {
			t.Fatal(err)
		}
	}
	res, err := h.Store.ProcessLeased(ctx, m, dedup.LeaseHandler(mustNotRun(t)), stalled)
	if err != nil || res.Outcome != dedup.OutcomeDeadLetter || res.Attempts != maxAttempts || res.HandlerCalled || res.DeadLetterID == 0 ||
		!errors.Is(res.Err, dedup.ErrExecutionLost) || !res.Outcome.Acked() || res.Status != dedup.StatusFailedFinal {
		t.Fatalf("copy after %d dead owners: %+v, %v; want an acked dead letter (ErrExecutionLost) at attempts %d, no run", maxAttempts, res, err, maxAttempts)
	}
	if r := lookup(t, h, "m-kill"); r.Status != dedup.StatusFailedFinal || r.Attempts != maxAttempts {
		t.Fatalf("record = %+v; want FAILED_FINAL with %d attempts", r, maxAttempts)
	}
	dl := deadLetters(t, h)
	if len(dl) != 1 {
		t.Fatalf("dead letters = %+v; want 1", dl)
	}
	checkDeadLetter(t, dl[0], m, dedup.ReasonAttemptsExhausted)
}

// crashLoopMarkers: a start marker whose run never reported an outcome (the
// process died) is counted by the next marker; once MaxAttempts runs
// started, the next marker dead-letters the delivery without a run. A run
// that returned (ClearStart) is not a death.
func crashLoopMarkers(t *testing.T, h Harness, sm StartMarker) {
	ctx := ctxOf(t)
	maxAttempts := h.Store.MaxAttempts()
	m := newMsg(t, "m-kill", "", "big")
	// The runtime marks only runs that may replay a crash, not a lane's
	// first run: a store counts that unmarked first run too, so
	// MaxAttempts-1 or MaxAttempts marked runs are allowed.
	runs := 0
	var mk dedup.StartMark
	for {
		var err error
		mk, err = sm.MarkStart(ctx, m)
		if err != nil {
			t.Fatalf("marker %d: %v", runs+1, err)
		}
		if !mk.Run {
			break
		}
		// The process dies here: no Process, no ClearStart.
		if runs++; runs > maxAttempts {
			t.Fatalf("%d marked runs died and the store still allows another; want at most MaxAttempts %d", runs, maxAttempts)
		}
	}
	if runs < maxAttempts-1 || mk.Result.Outcome != dedup.OutcomeDeadLetter || mk.Result.Attempts != maxAttempts ||
		!errors.Is(mk.Result.Err, dedup.ErrExecutionLost) || mk.Result.DeadLetterID == 0 || mk.Result.Status != dedup.StatusFailedFinal {
		t.Fatalf("marker after %d dead runs: %+v; want no run, a dead letter (ErrExecutionLost) at attempts %d after at least %d runs", runs, mk, maxAttempts, maxAttempts-1)
	}
	if res := process(t, h, m, mustNotRun(t)); res.Outcome != dedup.OutcomeDuplicate || res.Status != dedup.StatusFailedFinal {
		t.Fatalf("copy after the crash loop: %+v; want a duplicate of the FAILED_FINAL record", res)
	}
	dl := deadLetters(t, h)
	if len(dl) != 1 {
		t.Fatalf("dead letters = %+v; want 1", dl)
	}
	checkDeadLetter(t, dl[0], m, dedup.ReasonAttemptsExhausted)
	// Runs that return are not deaths: marked, run, failed, cleared, many
	// times over, and the handler still gets its MaxAttempts runs.
	c := &counter{fail: func(int64, *dedup.Message) error { return errors.New("transient") }}
	ok := newMsg(t, "m-ok", "", "small")
	for i := 1; i < maxAttempts; i++ {
		mk, err := sm.MarkStart(ctx, ok)
		if err != nil || !mk.Run {
			t.Fatalf("m-ok marker %d: %+v, %v", i, mk, err)
		}
		if res := process(t, h, ok, c.handle); res.Outcome != dedup.OutcomeRetry || res.Attempts != i {
			t.Fatalf("m-ok run %d: %+v; want retry at attempt %d", i, res, i)
		}
		if err := sm.ClearStart(ctx, mk); err != nil {
			t.Fatal(err)
		}
	}
	if mk, err := sm.MarkStart(ctx, ok); err != nil || !mk.Run {
		t.Fatalf("m-ok marker %d: %+v, %v; want Run (no run died)", maxAttempts, mk, err)
	}
}

func testConcurrentCopies(t *testing.T, _ Features, h Harness) {
	const copies = 20
	ctx := ctxOf(t)
	c := &counter{}
	hd := func(ctx context.Context, m *dedup.Message) error {
		// Hold the execution a moment, so that copies overlap it.
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
		return c.handle(ctx, m)
	}
	var processed, duplicates atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for ctx.Err() == nil {
				res, err := h.Mode.Process(ctx, newMsg(t, "m-1", "pay-1", `{"amount":10}`), hd)
				switch {
				case err != nil:
					t.Errorf("copy: %v", err)
					return
				case res.Outcome == dedup.OutcomeProcessed:
					processed.Add(1)
				case res.Outcome == dedup.OutcomeDuplicate:
					duplicates.Add(1)
				case res.Outcome == dedup.OutcomeRetry && errors.Is(res.Err, dedup.ErrLeaseHeld):
					time.Sleep(10 * time.Millisecond) // the broker redelivers later
					continue
				default:
					t.Errorf("copy: %+v", res)
				}
				return
			}
		}()
	}
	close(start)
	wg.Wait()
	if processed.Load() != 1 || duplicates.Load() != copies-1 || c.effects.Load() != 1 {
		t.Fatalf("processed %d, duplicates %d, handler effects %d; want 1, %d, 1", processed.Load(), duplicates.Load(), c.effects.Load(), copies-1)
	}
	if r := lookup(t, h, "m-1"); r.Status != dedup.StatusSucceeded || r.Attempts != 1 {
		t.Fatalf("record = %+v; want SUCCEEDED, attempts 1", r)
	}
}

func testRetentionPurge(t *testing.T, f Features, h Harness) {
	if f.NoPurge || h.ExpireRecord == nil {
		t.Skip("feature NoPurge: the store keeps records forever")
	}
	ctx := ctxOf(t)
	c := &counter{fail: func(_ int64, m *dedup.Message) error {
		if m.Identity.MessageID == "m-retry" {
			return errors.New("not yet")
		}
		return nil
	}}
	for _, id := range []string{"m-old", "m-live", "m-retry"} {
		process(t, h, newMsg(t, id, "", "x"), c.handle)
	}
	if err := h.ExpireRecord(ctx, scope, "m-old"); err != nil {
		t.Fatalf("ExpireRecord: %v", err)
	}
	gone := func() bool {
		_, err := h.Admin.Lookup(ctx, scope, "m-old")
		if err != nil && !errors.Is(err, dedup.ErrNotFound) {
			t.Fatalf("Lookup: %v", err)
		}
		return errors.Is(err, dedup.ErrNotFound)
	}
	if h.Purge != nil {
		if err := h.Purge(ctx); err != nil {
			t.Fatalf("Purge: %v", err)
		}
		if !gone() {
			t.Fatal("the record past its retention survived Purge")
		}
	} else {
		eventually(t, 30*time.Second, "the record past its retention goes", gone)
	}
	if r := lookup(t, h, "m-live"); r.Status != dedup.StatusSucceeded {
		t.Fatalf("m-live = %+v; want kept (its retention runs)", r)
	}
	if r := lookup(t, h, "m-retry"); r.Status != dedup.StatusFailedRetryable {
		t.Fatalf("m-retry = %+v; want kept (not final)", r)
	}
	// A copy redelivered after its record was purged runs again: the
	// reason retention must cover the broker's redelivery horizon.
	if res := process(t, h, newMsg(t, "m-old", "", "x"), c.handle); res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 {
		t.Fatalf("copy of the purged message: %+v; want processed as new", res)
	}
	if res := process(t, h, newMsg(t, "m-live", "", "x"), mustNotRun(t)); res.Outcome != dedup.OutcomeDuplicate {
		t.Fatalf("copy of the kept message: %+v; want a duplicate", res)
	}
}

func testPurgeMeetsCopies(t *testing.T, _ Features, h Harness) {
	ctx := ctxOf(t)
	c := &counter{}
	copyOf := func() *dedup.Message { return newMsg(t, "m-1", "", `{"amount":27}`) }
	process(t, h, copyOf(), c.handle)
	if err := h.ExpireRecord(ctx, scope, "m-1"); err != nil {
		t.Fatalf("ExpireRecord: %v", err)
	}
	var processed atomic.Int64
	deliver := func(i int) dedup.Result {
		res, err := h.Mode.Process(ctx, copyOf(), c.handle)
		switch {
		case err != nil:
			t.Errorf("copy %d: %v", i, err)
		case res.Outcome == dedup.OutcomeProcessed:
			processed.Add(1)
		case res.Outcome == dedup.OutcomeDuplicate:
		case res.Outcome == dedup.OutcomeRetry && errors.Is(res.Err, dedup.ErrLeaseHeld):
		default:
			t.Errorf("copy %d: %+v; want processed, a duplicate or held", i, res)
		}
		return res
	}
	// Eight copies and the purge, released by one channel.
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { <-start; deliver(i) })
	}
	wg.Go(func() {
		<-start
		if h.Purge != nil {
			if err := h.Purge(ctx); err != nil {
				t.Errorf("Purge: %v", err)
			}
		}
	})
	close(start)
	wg.Wait()
	if h.Purge == nil && processed.Load() == 0 {
		// The store's own expiry: the old record goes by itself.
		eventually(t, 30*time.Second, "the record past its retention goes", func() bool {
			_, err := h.Admin.Lookup(ctx, scope, "m-1")
			return errors.Is(err, dedup.ErrNotFound)
		})
	}
	deliver(8)
	if last := deliver(9); last.Outcome != dedup.OutcomeDuplicate {
		t.Errorf("the last copy: %+v; want a duplicate of the new execution", last)
	}
	if processed.Load() != 1 || c.effects.Load() != 2 {
		t.Fatalf("processed %d, handler effects %d; want 1 new execution (2 effects with the first)", processed.Load(), c.effects.Load())
	}
}

func testBatchInOrder(t *testing.T, _ Features, h Harness) {
	if h.Mode.Batch == nil {
		t.Skipf("mode %s takes one delivery per call (the batched-mode run covers batches)", h.Mode.Name)
	}
	c := &counter{fail: func(_ int64, m *dedup.Message) error {
		if m.Identity.MessageID == "m-bad" {
			return dedup.Permanent(errors.New("rejected"))
		}
		return nil
	}}
	msgs := []*dedup.Message{
		newMsg(t, "m-1", "pay-1", "a"),
		newMsg(t, "m-1", "pay-1", "a"), // broker copy in the same batch
		newMsg(t, "m-2", "pay-1", "b"), // same business key, other payload
		newMsg(t, "m-bad", "", "c"),    // fails alone
		newMsg(t, "m-3", "", "d"),
	}
	res, err := h.Mode.Batch(ctxOf(t), msgs, c.handle)
	if err != nil {
		t.Fatal(err)
	}
	want := []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDuplicate, dedup.OutcomeConflict, dedup.OutcomeDeadLetter, dedup.OutcomeProcessed}
	for i := range want {
		if res[i].Outcome != want[i] {
			t.Fatalf("result %d (%s) = %+v; want %s (all: %+v)", i, msgs[i].Identity, res[i], want[i], res)
		}
	}
	if c.effects.Load() != 2 {
		t.Fatalf("effects = %d; want 2 (m-1 once, m-3)", c.effects.Load())
	}
	for id, st := range map[string]dedup.Status{"m-1": dedup.StatusSucceeded, "m-bad": dedup.StatusFailedFinal, "m-3": dedup.StatusSucceeded} {
		if r := lookup(t, h, id); r.Status != st {
			t.Fatalf("%s record = %+v; want %s", id, r, st)
		}
	}
	if dl := deadLetters(t, h); len(dl) != 2 {
		t.Fatalf("dead letters = %+v; want 2 (the conflict, the permanent error)", dl)
	}
}

func testRenewalFindsTakeover(t *testing.T, _ Features, h Harness) {
	if !h.Mode.Lease {
		t.Skipf("mode %s has no lease (the lease-mode run of the store covers it)", h.Mode.Name)
	}
	ctx := ctxOf(t)
	m := newMsg(t, "m-1", "", "x")
	type outcome struct {
		res   dedup.Result
		err   error
		cause error
	}
	claimed, done := make(chan struct{}), make(chan outcome, 1)
	go func() {
		var cause error
		res, err := h.Store.ProcessLeased(ctx, m, func(hctx context.Context, _ *dedup.Message) error {
			close(claimed)
			<-hctx.Done()
			cause = context.Cause(hctx)
			return nil
		}, dedup.LeaseOptions{TTL: 5 * time.Minute, Heartbeat: 50 * time.Millisecond})
		done <- outcome{res, err, cause}
	}()
	<-claimed
	if err := h.ExpireLease(ctx, scope, "m-1"); err != nil {
		t.Fatal(err)
	}
	// B takes over and completes; A's renewals may have set its lease
	// again meanwhile (it still owned the record): expire until B gets it.
	eventually(t, time.Minute, "a copy takes the record over", func() bool {
		if err := h.ExpireLease(ctx, scope, "m-1"); err != nil {
			t.Fatal(err)
		}
		res, err := h.Store.ProcessLeased(ctx, m, func(context.Context, *dedup.Message) error { return nil }, stalled)
		if err != nil || res.Outcome != dedup.OutcomeRetry && res.Outcome != dedup.OutcomeProcessed {
			t.Fatalf("copy: %+v, %v", res, err)
		}
		return res.Outcome == dedup.OutcomeProcessed
	})
	var a outcome
	select {
	case a = <-done:
	case <-time.After(time.Minute):
		t.Fatal("A's context was not canceled after the takeover")
	}
	if a.err != nil || a.res.Outcome != dedup.OutcomeFenced || !errors.Is(a.cause, dedup.ErrFenced) || a.res.Outcome.Acked() {
		t.Fatalf("A: %+v, %v, context cause %v; want fenced by its renewal (cause ErrFenced), not acked", a.res, a.err, a.cause)
	}
}

func testHeartbeat(t *testing.T, _ Features, h Harness) {
	if !h.Mode.Lease {
		t.Skipf("mode %s has no lease (the lease-mode run of the store covers it)", h.Mode.Name)
	}
	ctx := ctxOf(t)
	m := newMsg(t, "m-long", "", "x")
	const ttl = time.Second
	probes := 0
	res, err := h.Store.ProcessLeased(ctx, m, func(hctx context.Context, _ *dedup.Message) error {
		// Run past twice the TTL, a copy every 200 ms: only the
		// heartbeats (every 100 ms) keep the lease held.
		end := time.Now().Add(2*ttl + 500*time.Millisecond)
		for time.Now().Before(end) {
			select {
			case <-hctx.Done():
				return fmt.Errorf("owner's context ended: %w", context.Cause(hctx))
			case <-time.After(200 * time.Millisecond):
			}
			r, err := h.Store.ProcessLeased(ctx, m, dedup.LeaseHandler(mustNotRun(t)), dedup.LeaseOptions{TTL: ttl})
			if err != nil || r.Outcome != dedup.OutcomeRetry || !errors.Is(r.Err, dedup.ErrLeaseHeld) || r.HandlerCalled {
				return fmt.Errorf("copy while the owner renews: %+v, %v; want retry on the held lease", r, err)
			}
			probes++
		}
		return nil
	}, dedup.LeaseOptions{TTL: ttl, Heartbeat: 100 * time.Millisecond})
	if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 {
		t.Fatalf("owner: %+v, %v; want processed at attempt 1 after %d copies found the lease held", res, err, probes)
	}
}

func testIdempotencyKeyAcrossResend(t *testing.T, _ Features, h Harness) {
	if !h.Mode.Lease {
		t.Skipf("mode %s has no lease (the lease-mode run of the store covers it)", h.Mode.Name)
	}
	var keys []string
	hd := func(ctx context.Context, m *dedup.Message) error {
		l, _ := dedup.LeaseFromContext(ctx)
		keys = append(keys, l.IdempotencyKey())
		if m.Identity.MessageID == "m-1" {
			return errors.New("provider timed out after charging")
		}
		return nil
	}
	if r := process(t, h, newMsg(t, "m-1", "pay-1", "x"), hd); r.Outcome != dedup.OutcomeRetry {
		t.Fatalf("m-1: %+v; want retry", r)
	}
	if r := process(t, h, newMsg(t, "m-2", "pay-1", "x"), hd); r.Outcome != dedup.OutcomeProcessed || r.Attempts != 2 {
		t.Fatalf("m-2 (same business key): %+v; want processed as attempt 2 of m-1's record", r)
	}
	want := scope + "/m-1/pay-1"
	if len(keys) != 2 || keys[0] != want || keys[1] != want {
		t.Fatalf("idempotency keys %q; want both %s", keys, want)
	}
	if r := lookup(t, h, "m-1"); r.Status != dedup.StatusSucceeded || r.Attempts != 2 {
		t.Fatalf("m-1's record = %+v; want SUCCEEDED after 2 attempts", r)
	}
}

func testReject(t *testing.T, _ Features, h Harness) {
	ctx := ctxOf(t)
	reject := func(m *dedup.Message) dedup.Result {
		t.Helper()
		r, err := h.Store.Reject(ctx, m, dedup.ReasonBadInput, errors.New("unparsable payload"))
		if err != nil {
			t.Fatalf("Reject %s: %v", m.Identity, err)
		}
		return r
	}
	garbage := newMsg(t, "m-1", "pay-1", "garbage")
	if r := reject(garbage); r.Outcome != dedup.OutcomeDeadLetter || r.Reason != dedup.ReasonBadInput || r.DeadLetterID == 0 || r.HandlerCalled || !r.Outcome.Acked() {
		t.Fatalf("Reject: %+v; want an acked dead letter bad_input", r)
	}
	if r := reject(garbage); r.Outcome != dedup.OutcomeDuplicate {
		t.Fatalf("Reject of a rejected copy: %+v; want a duplicate", r)
	}
	if r := lookup(t, h, "m-1"); r.Status != dedup.StatusFailedFinal || !strings.Contains(r.LastError, "unparsable payload") {
		t.Fatalf("record = %+v; want FAILED_FINAL with the cause", r)
	}
	if r := process(t, h, newMsg(t, "m-2", "pay-1", "fine"), mustNotRun(t)); r.Outcome != dedup.OutcomeConflict || r.MatchedBy != dedup.ByBusinessKey {
		t.Fatalf("m-2 with the rejected business key: %+v; want a conflict by business key", r)
	}
	c := &counter{}
	if r := process(t, h, newMsg(t, "m-3", "pay-3", "fine"), c.handle); r.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("m-3: %+v", r)
	}
	if r := reject(newMsg(t, "m-4", "pay-3", "garbage")); r.Outcome != dedup.OutcomeDuplicate || r.MatchedBy != dedup.ByBusinessKey {
		t.Fatalf("rejected re-send of a succeeded payment: %+v; want a duplicate by business key", r)
	}
	dl := deadLetters(t, h)
	if len(dl) < 1 {
		t.Fatal("no dead letter")
	}
	checkDeadLetter(t, dl[0], garbage, dedup.ReasonBadInput)
	if !h.Mode.Lease {
		return
	}
	// An owner holds m-5's live lease: not rejected until it expired.
	m5 := newMsg(t, "m-5", "", "x")
	o := startOwner(t, h, m5, stalled)
	if r := reject(m5); r.Outcome != dedup.OutcomeRetry || r.Outcome.Acked() {
		t.Fatalf("Reject while the owner's lease is live: %+v; want retry", r)
	}
	if err := h.ExpireLease(ctx, scope, "m-5"); err != nil {
		t.Fatal(err)
	}
	if r := reject(m5); r.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("Reject after the owner's lease expired: %+v; want a dead letter", r)
	}
	if r := o.finish(t, nil); r.res.Outcome != dedup.OutcomeFenced {
		t.Fatalf("the owner after the rejection: %+v, %v; want fenced", r.res, r.err)
	}
}
