package redisstore

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/redis/go-redis/v9"
)

// These tests run the scripts on miniredis, an in-memory stand-in for
// Redis with a Lua interpreter (the integration tests run them on a real
// Redis, a real Redis Cluster, and through a proxy that loses replies).

// sendTwice is a go-redis hook that sends every script call twice and keeps
// the second reply, as go-redis does when the first reply is lost with its
// connection (the first run happened; its answer never arrived).
type sendTwice struct{}

func (sendTwice) DialHook(next redis.DialHook) redis.DialHook { return next }
func (sendTwice) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := strings.ToLower(cmd.Name()); n == "evalsha" || n == "eval" {
			_ = next(ctx, cmd)
			cmd.SetErr(nil)
		}
		return next(ctx, cmd)
	}
}
func (sendTwice) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// miniStore is a Store on a fresh miniredis; twice makes every script run
// twice per call.
func miniStore(t *testing.T, twice bool, tweak func(*Config)) (*Store, *miniredis.Miniredis) {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	if twice {
		c.AddHook(sendTwice{})
	}
	cfg := Config{Client: c, Fingerprinter: testFingerprinter(t), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, m
}

func testMsg(t *testing.T, mid, bk, payload string) *dedup.Message {
	t.Helper()
	id, err := dedup.NewIdentity("billing", mid, "", bk)
	if err != nil {
		t.Fatal(err)
	}
	return &dedup.Message{Identity: id, Payload: []byte(payload), Topic: "payments", Source: "test:" + mid}
}

// Every store call answers the same whether each of its scripts ran once
// or twice (S18): claim (new, takeover, attempts used up, conflicts of
// both kinds with their reasons, by business key, a re-driven record
// taking its fingerprint), renew, complete, fail, release, re-drive and
// reject (keeping the payload's fingerprint).
func TestScriptsAnswerASecondRunTheSame(t *testing.T) {
	ok := func(context.Context, *dedup.Message) error { return nil }
	opt := dedup.LeaseOptions{TTL: 5 * time.Second, DisableHeartbeat: true}
	for _, twice := range []bool{false, true} {
		name := "once"
		if twice {
			name = "twice"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var refuse atomic.Bool // the canonicalizer refuses every payload while set
			s, m := miniStore(t, twice, func(c *Config) {
				c.MaxAttempts = 2
				fp, err := dedup.NewFingerprinter(func(b []byte) ([]byte, error) {
					if refuse.Load() {
						return nil, errors.New("schema not known yet")
					}
					return b, nil
				}, dedup.FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef")})
				if err != nil {
					t.Fatal(err)
				}
				c.Fingerprinter = fp
			})
			oneDeadLetter := func(r dedup.Result, mid, reason string) {
				t.Helper()
				if r.Reason != reason {
					t.Fatalf("%s: result's reason %q, want %q", mid, r.Reason, reason)
				}
				dls, err := s.DeadLetters(ctx, "billing", 0, 100)
				if err != nil {
					t.Fatal(err)
				}
				var mine []dedup.DeadLetter
				for _, d := range dls {
					if d.MessageID == mid {
						mine = append(mine, d)
					}
				}
				if len(mine) != 1 || mine[0].Reason != reason || r.DeadLetterID == 0 || r.DeadLetterID != mine[0].ID {
					t.Fatalf("%s: dead letters %+v, result's ID %d; want one %s with that ID", mid, mine, r.DeadLetterID, reason)
				}
			}

			// New, then a duplicate, by message ID and by business key.
			r, err := s.ProcessLeased(ctx, testMsg(t, "m-1", "pay-1", "a"), ok, opt)
			if err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 1 {
				t.Fatalf("m-1: %+v, %v; want processed at attempt 1", r, err)
			}
			if rec, _ := s.Lookup(ctx, "billing", "m-1"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 || rec.Fence != 1 {
				t.Fatalf("m-1 record = %+v", rec)
			}
			if r, err := s.ProcessLeased(ctx, testMsg(t, "m-2", "pay-1", "a"), ok, opt); err != nil || r.Outcome != dedup.OutcomeDuplicate || r.MatchedBy != dedup.ByBusinessKey {
				t.Fatalf("m-2: %+v, %v; want a duplicate by business key", r, err)
			}

			// A conflict of each kind: one dead letter each, its ID and
			// reason answered.
			r, err = s.ProcessLeased(ctx, testMsg(t, "m-1", "pay-1", "other"), ok, opt)
			if err != nil || r.Outcome != dedup.OutcomeConflict || !errors.Is(r.Err, dedup.ErrPayloadConflict) {
				t.Fatalf("payload conflict: %+v, %v", r, err)
			}
			oneDeadLetter(r, "m-1", dedup.ReasonPayloadConflict)
			r, err = s.ProcessLeased(ctx, testMsg(t, "m-1", "pay-9", "another"), ok, opt)
			if err != nil || r.Outcome != dedup.OutcomeConflict || !errors.Is(r.Err, dedup.ErrMessageIDCollision) {
				t.Fatalf("message-ID collision: %+v, %v", r, err)
			}
			var ce *dedup.ConflictError
			if !errors.As(r.Err, &ce) || ce.Record.BusinessKey != "pay-1" || ce.Identity.BusinessKey != "pay-9" {
				t.Fatalf("message-ID collision: Err %#v; want the record's business key pay-1", r.Err)
			}
			dls, err := s.DeadLetters(ctx, "billing", 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range dls {
				if d.MessageID == "m-1" {
					got = append(got, d.Reason)
				}
			}
			if len(got) != 2 || got[0] != dedup.ReasonPayloadConflict || got[1] != dedup.ReasonMessageIDCollision ||
				dls[len(dls)-1].ID != r.DeadLetterID {
				t.Fatalf("m-1 dead letters %v (last %d), result's ID %d; want payload_conflict, then message_id_collision with that ID",
					got, dls[len(dls)-1].ID, r.DeadLetterID)
			}

			// A retryable failure, then a takeover at attempt 2.
			r, err = s.ProcessLeased(ctx, testMsg(t, "m-3", "", "c"), func(context.Context, *dedup.Message) error { return errors.New("down") }, opt)
			if err != nil || r.Outcome != dedup.OutcomeRetry || r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 {
				t.Fatalf("m-3 failure: %+v, %v; want retry at attempt 1", r, err)
			}
			var fence int64
			r, err = s.ProcessLeased(ctx, testMsg(t, "m-3", "", "c"), func(hctx context.Context, _ *dedup.Message) error {
				l, _ := dedup.LeaseFromContext(hctx)
				fence = l.Fence
				return nil
			}, opt)
			if err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 2 || fence != 2 {
				t.Fatalf("m-3 takeover: %+v, %v, fence %d; want processed at attempt 2, fence 2", r, err, fence)
			}

			// A permanent failure, then a re-drive and a run after it.
			r, err = s.ProcessLeased(ctx, testMsg(t, "m-4", "", "d"), func(context.Context, *dedup.Message) error {
				return dedup.Permanent(errors.New("refused"))
			}, opt)
			if err != nil || r.Outcome != dedup.OutcomeDeadLetter {
				t.Fatalf("m-4: %+v, %v", r, err)
			}
			oneDeadLetter(r, "m-4", dedup.ReasonPermanentError)
			if err := s.Redrive(ctx, "billing", "m-4"); err != nil {
				t.Fatalf("Redrive(m-4) = %v", err)
			}
			if err := s.Redrive(ctx, "billing", "m-4"); !errors.Is(err, dedup.ErrNotFinal) {
				t.Fatalf("a second, separate Redrive(m-4) = %v, want ErrNotFinal", err)
			}
			if r, err := s.ProcessLeased(ctx, testMsg(t, "m-4", "", "d"), ok, opt); err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 2 {
				t.Fatalf("m-4 after the re-drive: %+v, %v", r, err)
			}

			// An owner that never reports back used the last attempt: the
			// next claim dead-letters.
			msg5 := testMsg(t, "m-5", "", "e")
			sums, _ := s.keyedSums(msg5.Payload)
			for attempt := 1; attempt <= 2; attempt++ {
				c, _, err := s.claim(ctx, msg5, sums, time.Second)
				if err != nil || c == nil || c.lease.Attempt != attempt {
					t.Fatalf("m-5 claim %d: %+v, %v", attempt, c, err)
				}
				m.FastForward(2 * time.Second) // its lease lapses
			}
			r, err = s.ProcessLeased(ctx, testMsg(t, "m-5", "", "e"), ok, opt)
			if err != nil || r.Outcome != dedup.OutcomeDeadLetter || r.Attempts != 2 || r.HandlerCalled {
				t.Fatalf("m-5: %+v, %v; want a dead letter after 2 attempts", r, err)
			}
			oneDeadLetter(r, "m-5", dedup.ReasonAttemptsExhausted)

			// Renew, release and complete on one claim's marks.
			msg6 := testMsg(t, "m-6", "pay-6", "f")
			sums, _ = s.keyedSums(msg6.Payload)
			c, _, err := s.claim(ctx, msg6, sums, time.Second)
			if err != nil || c == nil {
				t.Fatalf("m-6 claim: %+v, %v", c, err)
			}
			again, _, err := s.claim(ctx, msg6, sums, time.Second)
			if err != nil || again != nil {
				t.Fatalf("m-6, another copy's claim: %+v, %v; want none (lease held)", again, err)
			}
			marks := &redisLease{s: s, msg: msg6, c: c, ttl: time.Second}
			if held, err := marks.Renew(ctx); err != nil || !held {
				t.Fatalf("Renew = %v, %v; want held", held, err)
			}
			if err := marks.Release(ctx); err != nil {
				t.Fatalf("Release = %v, want nil", err)
			}
			if rec, _ := s.Lookup(ctx, "billing", "m-6"); rec.Status != dedup.StatusFailedRetryable || rec.Attempts != 0 {
				t.Fatalf("m-6 after the release: %+v; want FAILED_RETRYABLE, attempts 0", rec)
			}
			if err := marks.Release(ctx); err != nil {
				t.Fatalf("the same owner's Release again = %v, want nil (the same answer)", err)
			}
			stale := marks
			c, _, err = s.claim(ctx, msg6, sums, time.Second)
			if err != nil || c == nil || c.lease.Attempt != 1 || c.lease.Fence != 2 {
				t.Fatalf("m-6 claim after the release: %+v, %v; want attempt 1, fence 2", c, err)
			}
			marks = &redisLease{s: s, msg: msg6, c: c, ttl: time.Second}
			if fenced, err := marks.Succeed(ctx); err != nil || fenced {
				t.Fatalf("Succeed = fenced %v, %v", fenced, err)
			}
			if fenced, err := marks.Succeed(ctx); err != nil || fenced {
				t.Fatalf("the same owner's Succeed again = fenced %v, %v; want done (the same answer)", fenced, err)
			}
			if held, err := marks.Renew(ctx); err != nil || held {
				t.Fatalf("Renew after completion = %v, %v; want not held", held, err)
			}
			if err := stale.Release(ctx); !errors.Is(err, dedup.ErrFenced) {
				t.Fatalf("the first owner's Release after another owner finished = %v, want ErrFenced", err)
			}
			if fenced, err := stale.Succeed(ctx); err != nil || !fenced {
				t.Fatalf("the first owner's Succeed after another owner finished = fenced %v, %v; want fenced", fenced, err)
			}

			// A dead letter's ID is the answer of the execution that wrote it
			// only: after a re-drive, the next owner's failure mark answers
			// none, on a second run too.
			msg8 := testMsg(t, "m-8", "", "h")
			if r, err := s.ProcessLeased(ctx, msg8, func(context.Context, *dedup.Message) error {
				return dedup.Permanent(errors.New("refused"))
			}, opt); err != nil || r.DeadLetterID == 0 {
				t.Fatalf("m-8: %+v, %v", r, err)
			}
			if err := s.Redrive(ctx, "billing", "m-8"); err != nil {
				t.Fatal(err)
			}
			sums, _ = s.keyedSums(msg8.Payload)
			c8, _, err := s.claim(ctx, msg8, sums, time.Second)
			if err != nil || c8 == nil {
				t.Fatalf("m-8 claim after the re-drive: %+v, %v", c8, err)
			}
			m8 := &redisLease{s: s, msg: msg8, c: c8, ttl: time.Second}
			if dl, fenced, err := m8.Fail(ctx, dedup.StatusFailedRetryable, "", errors.New("down")); err != nil || fenced || dl != 0 {
				t.Fatalf("m-8 retryable failure after the re-drive: dead letter %d, fenced %v, %v; want none", dl, fenced, err)
			}

			// A rejection: the record keeps the payload's fingerprint, so
			// once re-driven the next copy runs.
			r, err = s.Reject(ctx, testMsg(t, "m-7", "", "g"), dedup.ReasonBadInput, errors.New("no key"))
			if err != nil || r.Outcome != dedup.OutcomeDeadLetter {
				t.Fatalf("m-7: %+v, %v", r, err)
			}
			oneDeadLetter(r, "m-7", dedup.ReasonBadInput)
			if r, err := s.Reject(ctx, testMsg(t, "m-7", "", "g"), dedup.ReasonBadInput, errors.New("no key")); err != nil || r.Outcome != dedup.OutcomeDuplicate {
				t.Fatalf("m-7, a second, separate Reject: %+v, %v; want a duplicate", r, err)
			}
			sums, _ = s.keyedSums([]byte("g"))
			if rec, _ := s.Lookup(ctx, "billing", "m-7"); string(rec.Fingerprint) != string(sums[0].Sum) {
				t.Fatalf("m-7 rejected record %+v; want the payload's fingerprint", rec)
			}
			if err := s.Redrive(ctx, "billing", "m-7"); err != nil {
				t.Fatal(err)
			}
			if r, err := s.ProcessLeased(ctx, testMsg(t, "m-7", "", "g"), ok, opt); err != nil || r.Outcome != dedup.OutcomeProcessed {
				t.Fatalf("m-7 after the re-drive: %+v, %v; want processed", r, err)
			}

			// A rejection of a payload that cannot be fingerprinted: after
			// the re-drive, the next copy gives the record its fingerprint.
			refuse.Store(true)
			r, err = s.Reject(ctx, testMsg(t, "m-9", "", "i"), dedup.ReasonBadInput, errors.New("unknown schema"))
			refuse.Store(false)
			if err != nil || r.Outcome != dedup.OutcomeDeadLetter {
				t.Fatalf("m-9: %+v, %v", r, err)
			}
			oneDeadLetter(r, "m-9", dedup.ReasonBadInput)
			if rec, _ := s.Lookup(ctx, "billing", "m-9"); len(rec.Fingerprint) != 0 {
				t.Fatalf("m-9 rejected record %+v; want no fingerprint", rec)
			}
			if err := s.Redrive(ctx, "billing", "m-9"); err != nil {
				t.Fatal(err)
			}
			if r, err := s.ProcessLeased(ctx, testMsg(t, "m-9", "", "i"), ok, opt); err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 1 {
				t.Fatalf("m-9 after the re-drive: %+v, %v; want processed at attempt 1", r, err)
			}
			sums, _ = s.keyedSums([]byte("i"))
			if rec, _ := s.Lookup(ctx, "billing", "m-9"); rec.Status != dedup.StatusSucceeded || string(rec.Fingerprint) != string(sums[0].Sum) {
				t.Fatalf("m-9 record %+v; want SUCCEEDED with the copy's fingerprint", rec)
			}
			if r, err := s.ProcessLeased(ctx, testMsg(t, "m-9", "", "j"), ok, opt); err != nil || r.Outcome != dedup.OutcomeConflict || r.Reason != dedup.ReasonPayloadConflict {
				t.Fatalf("m-9, another payload: %+v, %v; want a payload conflict", r, err)
			}
		})
	}
}

func TestClaimReply(t *testing.T) {
	id := dedup.Identity{Scope: "s", MessageID: "m-2", BusinessKey: "b"}
	tok := uuid.New()
	c, res, err := claimReply(id, "m-1", tok, []any{"RUN", int64(2), int64(3), "m-1", "b"})
	if err != nil || c == nil || res.Outcome != "" || c.lease.Attempt != 2 || c.lease.Fence != 3 || c.lease.OwnerToken != tok ||
		c.recordMID != "m-1" || c.lease.Record.MessageID != "m-1" || c.lease.Identity != id {
		t.Fatalf("RUN: %+v, %+v, %v", c, res, err)
	}
	for _, bad := range [][]any{{"RUN", int64(0), int64(1), "m", ""}, {"RUN", int64(1), int64(1), "", ""}, {"RUN"}, {"WHAT"}, {},
		{"CONFLICT", "SUCCEEDED", int64(1), "message_id", ""}, {"CONFLICT", "SUCCEEDED", int64(1), "message_id", "", "fingerprint_conflict", ""}} {
		if c, _, err := claimReply(id, "m-1", tok, bad); err == nil || c != nil {
			t.Errorf("claimReply(%v) = %+v, nil error; want an error", bad, c)
		}
	}
	cases := []struct {
		reply []any
		want  dedup.Result
	}{
		{[]any{"DUP", "SUCCEEDED", int64(1), "business_key"}, dedup.Result{Outcome: dedup.OutcomeDuplicate, Status: dedup.StatusSucceeded, Attempts: 1, MatchedBy: dedup.ByBusinessKey}},
		{[]any{"HELD", "PROCESSING", int64(2), "message_id"}, dedup.Result{Outcome: dedup.OutcomeRetry, Status: dedup.StatusProcessing, Attempts: 2, MatchedBy: dedup.ByMessageID}},
		{[]any{"CONFLICT", "SUCCEEDED", int64(1), "message_id", "1700000000000-3", "message_id_collision", "a"}, dedup.Result{Outcome: dedup.OutcomeConflict, Status: dedup.StatusSucceeded, Attempts: 1, MatchedBy: dedup.ByMessageID, DeadLetterID: 1700000000000_000003, Reason: dedup.ReasonMessageIDCollision}},
		{[]any{"CONFLICT", "SUCCEEDED", int64(1), "message_id", "", "payload_conflict", "b"}, dedup.Result{Outcome: dedup.OutcomeConflict, Status: dedup.StatusSucceeded, Attempts: 1, MatchedBy: dedup.ByMessageID, Reason: dedup.ReasonPayloadConflict}},
		{[]any{"EXHAUSTED", int64(3), "message_id", "1700000000000-0"}, dedup.Result{Outcome: dedup.OutcomeDeadLetter, Status: dedup.StatusFailedFinal, Attempts: 3, MatchedBy: dedup.ByMessageID, DeadLetterID: 1700000000000_000000, Reason: dedup.ReasonAttemptsExhausted}},
	}
	for _, tc := range cases {
		c, res, err := claimReply(id, "m-1", tok, tc.reply)
		res.Err = nil
		if err != nil || c != nil || res != tc.want {
			t.Errorf("claimReply(%v) = %+v, %+v, %v; want %+v", tc.reply, c, res, err, tc.want)
		}
	}
	if _, res, _ := claimReply(id, "m-1", tok, []any{"HELD", "PROCESSING", int64(1), "message_id"}); !errors.Is(res.Err, dedup.ErrLeaseHeld) {
		t.Errorf("HELD: Err = %v, want ErrLeaseHeld", res.Err)
	}
	if _, res, _ := claimReply(id, "m-1", tok, []any{"CONFLICT", "SUCCEEDED", int64(1), "message_id", "", "payload_conflict", "b"}); !errors.Is(res.Err, dedup.ErrFingerprintConflict) ||
		!errors.Is(res.Err, dedup.ErrPayloadConflict) {
		t.Errorf("CONFLICT: Err = %v, want ErrFingerprintConflict and ErrPayloadConflict", res.Err)
	}
	_, res, _ = claimReply(id, "m-1", tok, []any{"CONFLICT", "SUCCEEDED", int64(1), "message_id", "", "message_id_collision", "a"})
	var ce *dedup.ConflictError
	if !errors.As(res.Err, &ce) || !errors.Is(res.Err, dedup.ErrMessageIDCollision) ||
		ce.Record != (dedup.Identity{Scope: "s", MessageID: "m-1", BusinessKey: "a"}) || ce.Identity != id || ce.MatchedBy != dedup.ByMessageID {
		t.Errorf("CONFLICT (collision): Err = %#v, want a ConflictError naming record s/m-1/a", res.Err)
	}
}

func TestFinishAndRejectAndRedriveReplies(t *testing.T) {
	if dl, fenced, err := finishReply([]any{int64(0)}); err != nil || !fenced || dl != 0 {
		t.Errorf("{0}: %d, %v, %v; want fenced", dl, fenced, err)
	}
	if dl, fenced, err := finishReply([]any{int64(1), ""}); err != nil || fenced || dl != 0 {
		t.Errorf("{1, \"\"}: %d, %v, %v; want done, no dead letter", dl, fenced, err)
	}
	if dl, fenced, err := finishReply([]any{int64(1), "1700000000000-2"}); err != nil || fenced || dl != 1700000000000_000002 {
		t.Errorf("{1, id}: %d, %v, %v; want done with the dead letter", dl, fenced, err)
	}
	for _, bad := range [][]any{{}, {int64(1)}, {int64(2), ""}, {int64(1), "x"}, {"1", ""}} {
		if _, _, err := finishReply(bad); err == nil {
			t.Errorf("finishReply(%v): nil error, want one", bad)
		}
	}

	id := dedup.Identity{Scope: "s", MessageID: "m"}
	cause := errors.New("bad")
	if r, err := rejectReply(id, dedup.ReasonBadInput, cause, []any{"DEAD", int64(0), "1700000000000-1", "message_id"}); err != nil || r.Outcome != dedup.OutcomeDeadLetter ||
		r.DeadLetterID != 1700000000000_000001 || r.Status != dedup.StatusFailedFinal || r.Err != cause || r.Reason != dedup.ReasonBadInput {
		t.Errorf("DEAD: %+v, %v", r, err)
	}
	if r, err := rejectReply(id, dedup.ReasonBadInput, cause, []any{"DUP", "FAILED_FINAL", int64(0), "message_id"}); err != nil || r.Outcome != dedup.OutcomeDuplicate {
		t.Errorf("DUP: %+v, %v", r, err)
	}
	if r, err := rejectReply(id, dedup.ReasonBadInput, cause, []any{"HELD", "PROCESSING", int64(1), "message_id"}); err != nil || r.Outcome != dedup.OutcomeRetry || !errors.Is(r.Err, dedup.ErrLeaseHeld) {
		t.Errorf("HELD: %+v, %v", r, err)
	}
	if _, err := rejectReply(id, dedup.ReasonBadInput, cause, []any{"NOPE"}); err == nil {
		t.Error("unexpected reject reply: nil error")
	}

	if err := redriveReply("s", "m", "FAILED_FINAL"); err != nil {
		t.Errorf("FAILED_FINAL: %v", err)
	}
	if err := redriveReply("s", "m", ""); !errors.Is(err, dedup.ErrNotFound) {
		t.Errorf("\"\": %v, want ErrNotFound", err)
	}
	if err := redriveReply("s", "m", "SUCCEEDED"); !errors.Is(err, dedup.ErrNotFinal) || !strings.Contains(err.Error(), "SUCCEEDED") {
		t.Errorf("SUCCEEDED: %v, want ErrNotFinal naming the status", err)
	}
}
