package integration

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testkit"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/faultproxy"
	"github.com/redis/go-redis/v9"
)

// Every call that a client retries must be safe to run twice (S18). A fault
// proxy (internal/faultproxy) between go-redis (default retries) and the
// real Redis loses the reply to one script call and closes the connection;
// go-redis sends the call again on a new connection, and the script, which
// already ran, must recognise its caller and answer as the first time. (The
// same fault on Postgres: dedup/pgstore's TestLeaseCallAnswersLost.)

// proxiedRedisStore is a Redis-only store whose go-redis client, with its
// default retries (MaxRetries 3), reaches Redis through a fault proxy.
func proxiedRedisStore(t *testing.T, tweak func(*redisstore.Config)) (*redisstore.Store, *faultproxy.Proxy) {
	t.Helper()
	p := faultproxy.New(t, redisAddress(t), faultproxy.RESP)
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	if c.Options().MaxRetries != 3 {
		t.Fatalf("go-redis MaxRetries = %d, want its default 3", c.Options().MaxRetries)
	}
	s := newRedisStore(t, func(cfg *redisstore.Config) {
		cfg.Client = c
		if tweak != nil {
			tweak(cfg)
		}
	})
	return s, p
}

// Predicates on the script calls of redisstore, by their keys and
// arguments (see dedup/redisstore/scripts.go).
func claimOf(messageID string) func([]byte) bool {
	return func(req []byte) bool {
		sc, ok := faultproxy.AsScript(req)
		return ok && sc.HasKey(":conflict:") && sc.HasKey(":rec:"+messageID)
	}
}

func renewCall(req []byte) bool {
	sc, ok := faultproxy.AsScript(req)
	return ok && len(sc.Keys) == 2 && sc.HasKey(":lease:")
}

// finishAs matches the completion script writing status (or "RELEASE").
func finishAs(status string) func([]byte) bool {
	return func(req []byte) bool {
		sc, ok := faultproxy.AsScript(req)
		return ok && len(sc.Keys) == 4 && sc.Arg(3) == status
	}
}

func redriveCall(req []byte) bool {
	sc, ok := faultproxy.AsScript(req)
	return ok && len(sc.Keys) == 2 && !sc.HasKey(":lease:")
}

func rejectCall(reason string) func([]byte) bool {
	return func(req []byte) bool {
		sc, ok := faultproxy.AsScript(req)
		return ok && len(sc.Keys) == 4 && sc.Arg(8) == reason
	}
}

// logBuffer collects a logger's output.
type logBuffer = testkit.LogBuffer

// S18: Redis-only store, go-redis with its default retries, lease TTL 1 s,
// MaxAttempts 1. The reply to the claim of capture/cap-88 is lost and the
// connection closed; go-redis claims again on a new connection. The retried
// claim recognises the caller's own lease: the handler runs once, the record
// is SUCCEEDED with attempts 1, no dead letter, and a second copy 1.3 s later
// is a duplicate. (Before, the retried claim answered "lease held", the
// runtime retried, and once the lease expired the takeover found the one
// attempt used up: a dead letter for a message that never ran.)
func TestS18RedisClaimReplyLost(t *testing.T) {
	t.Parallel()
	s, p := proxiedRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = 1 })
	var calls atomic.Int32
	cons, err := consumer.New(consumer.Config{Scope: "capture", Store: s, Lease: dedup.LeaseOptions{TTL: time.Second},
		LeaseHandler: func(context.Context, *dedup.Message) error { calls.Add(1); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	delivery := func() consumer.Delivery {
		return consumer.Delivery{Message: &dedup.Message{Topic: "capture", Payload: []byte(`{"amount":"12.00"}`)},
			MessageID: "cap-88", Position: "kafka:capture/0/88", Lane: "capture/0", Offset: 88}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	p.DropReplyOnce(claimOf("cap-88"))
	res, err := cons.HandleInPlace(ctx, delivery())
	if p.Dropped() != 1 {
		t.Fatalf("the proxy dropped %d claim replies, want 1", p.Dropped())
	}
	if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 || calls.Load() != 1 {
		t.Fatalf("first copy: %+v, %v, handler calls %d; want processed at attempt 1, one call", res, err, calls.Load())
	}
	time.Sleep(1300 * time.Millisecond)
	res, err = cons.Handle(ctx, delivery())
	if err != nil || res.Outcome != dedup.OutcomeDuplicate || calls.Load() != 1 {
		t.Fatalf("second copy 1.3 s later: %+v, %v, handler calls %d; want a duplicate, still one call", res, err, calls.Load())
	}
	rec, err := s.Lookup(ctx, "capture", "cap-88")
	if err != nil || rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 || rec.Fence != 1 {
		t.Fatalf("record = %+v, %v; want SUCCEEDED, attempts 1, fence 1", rec, err)
	}
	if dls, err := s.DeadLetters(ctx, "capture", 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters = %+v, %v; want none", dls, err)
	}
}

// The same for every other script: each one's reply is lost once, and the
// caller gets the answer it would have got without the loss, with the state
// written once.
func TestRedisScriptRepliesLost(t *testing.T) {
	t.Parallel()
	ok := func(context.Context, *dedup.Message) error { return nil }
	mustNotRun := func(t *testing.T) dedup.LeaseHandler {
		return func(context.Context, *dedup.Message) error { t.Error("handler ran"); return nil }
	}
	oneDeadLetter := func(t *testing.T, s *redisstore.Store, res dedup.Result, reason string) {
		t.Helper()
		dls, err := s.DeadLetters(context.Background(), "billing", 0, 10)
		if err != nil || len(dls) != 1 || dls[0].Reason != reason || res.DeadLetterID == 0 || res.DeadLetterID != dls[0].ID || res.Reason != reason {
			t.Fatalf("dead letters = %+v, %v; result's dead-letter ID %d, reason %q: want exactly one, %s, with that ID and reason",
				dls, err, res.DeadLetterID, res.Reason, reason)
		}
	}

	// A takeover claim of a FAILED_RETRYABLE record: the retried claim runs
	// the handler at attempt 2, not "lease held", and counts no third attempt.
	t.Run("claim-takeover", func(t *testing.T) {
		t.Parallel()
		s, p := proxiedRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = 3 })
		ctx := context.Background()
		if r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-take", "", "x"), func(context.Context, *dedup.Message) error {
			return errors.New("provider timeout")
		}, dedup.LeaseOptions{}); err != nil || r.Outcome != dedup.OutcomeRetry {
			t.Fatalf("first copy: %+v, %v", r, err)
		}
		p.DropReplyOnce(claimOf("m-take"))
		var fence int64
		r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-take", "", "x"), func(hctx context.Context, _ *dedup.Message) error {
			l, _ := dedup.LeaseFromContext(hctx)
			fence = l.Fence
			return nil
		}, dedup.LeaseOptions{})
		p.WaitDropped(1)
		if err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 2 || fence != 2 {
			t.Fatalf("second copy: %+v, %v, fence %d; want processed at attempt 2, fence 2", r, err, fence)
		}
		if rec, err := s.Lookup(ctx, "billing", "m-take"); err != nil || rec.Status != dedup.StatusSucceeded || rec.Attempts != 2 || rec.Fence != 2 {
			t.Fatalf("record = %+v, %v; want SUCCEEDED, attempts 2, fence 2", rec, err)
		}
	})

	// A takeover claim that finds the attempts used up by an owner that never
	// reported back: the retried claim answers the same dead letter, not
	// "duplicate", and writes one.
	t.Run("claim-exhausted", func(t *testing.T) {
		t.Parallel()
		s, p := proxiedRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = 1 })
		ctx := context.Background()
		opt := dedup.LeaseOptions{TTL: time.Second, DisableHeartbeat: true}
		release := make(chan struct{})
		defer close(release)
		running := make(chan struct{})
		go func() {
			_, _ = s.ProcessLeased(ctx, msg(t, "billing", "m-dead", "", "x"), func(context.Context, *dedup.Message) error {
				close(running)
				<-release // the owner "dies": it never returns while the test runs
				return nil
			}, opt)
		}()
		<-running
		waitLeaseGone(t, s, "m-dead")
		p.DropReplyOnce(claimOf("m-dead"))
		r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-dead", "", "x"), mustNotRun(t), opt)
		p.WaitDropped(1)
		if err != nil || r.Outcome != dedup.OutcomeDeadLetter || r.Attempts != 1 || r.HandlerCalled {
			t.Fatalf("copy after the dead owner: %+v, %v; want a dead letter after 1 attempt, handler not run", r, err)
		}
		oneDeadLetter(t, s, r, dedup.ReasonAttemptsExhausted)
	})

	// A conflicting payload, of each kind: the retried claim answers the
	// conflict with the dead letter its first run wrote, and its reason.
	for _, tc := range []struct {
		reason, bk string
		kind       error
	}{
		{dedup.ReasonPayloadConflict, "order-1", dedup.ErrPayloadConflict},       // the same business key
		{dedup.ReasonMessageIDCollision, "order-2", dedup.ErrMessageIDCollision}, // another one under the same ID
	} {
		t.Run("claim-conflict/"+tc.reason, func(t *testing.T) {
			t.Parallel()
			s, p := proxiedRedisStore(t, nil)
			ctx := context.Background()
			if r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-conf", "order-1", "x"), ok, dedup.LeaseOptions{}); err != nil || r.Outcome != dedup.OutcomeProcessed {
				t.Fatalf("first: %+v, %v", r, err)
			}
			p.DropReplyOnce(claimOf("m-conf"))
			r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-conf", tc.bk, "other payload"), mustNotRun(t), dedup.LeaseOptions{})
			p.WaitDropped(1)
			if err != nil || r.Outcome != dedup.OutcomeConflict || !errors.Is(r.Err, dedup.ErrFingerprintConflict) || !errors.Is(r.Err, tc.kind) {
				t.Fatalf("conflicting copy: %+v, %v; want a conflict (%v)", r, err, tc.kind)
			}
			oneDeadLetter(t, s, r, tc.reason)
		})
	}

	// The watchdog's renewal: its retry still finds the lease its own.
	t.Run("renew", func(t *testing.T) {
		t.Parallel()
		s, p := proxiedRedisStore(t, nil)
		scripts := countScripts(s.Config().Client)
		ctx := context.Background()
		var cause error
		r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-renew", "", "x"), func(hctx context.Context, _ *dedup.Message) error {
			p.DropReplyOnce(renewCall)
			p.WaitDropped(1)
			scripts.waitMore(t, 3, "three more renewals after the lost reply") // a few more heartbeats
			cause = context.Cause(hctx)
			return nil
		}, dedup.LeaseOptions{TTL: 3 * time.Second, Heartbeat: 100 * time.Millisecond})
		if err != nil || r.Outcome != dedup.OutcomeProcessed || cause != nil {
			t.Fatalf("%+v, %v, handler context ended with %v; want processed, never fenced", r, err, cause)
		}
	})

	// The completion: the retried one finds the record SUCCEEDED by this
	// owner and answers done, not fenced.
	t.Run("complete", func(t *testing.T) {
		t.Parallel()
		s, p := proxiedRedisStore(t, nil)
		ctx := context.Background()
		var calls atomic.Int32
		r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-done", "", "x"), func(context.Context, *dedup.Message) error {
			calls.Add(1)
			p.DropReplyOnce(finishAs(string(dedup.StatusSucceeded)))
			return nil
		}, dedup.LeaseOptions{})
		p.WaitDropped(1)
		if err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 1 || calls.Load() != 1 {
			t.Fatalf("%+v, %v, calls %d; want processed (acked) at attempt 1", r, err, calls.Load())
		}
		if rec, err := s.Lookup(ctx, "billing", "m-done"); err != nil || rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 {
			t.Fatalf("record = %+v, %v; want SUCCEEDED, attempts 1", rec, err)
		}
		if r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-done", "", "x"), mustNotRun(t), dedup.LeaseOptions{}); err != nil || r.Outcome != dedup.OutcomeDuplicate {
			t.Fatalf("next copy: %+v, %v; want a duplicate", r, err)
		}
	})

	// A retryable failure: the retried mark answers "marked", the attempt is
	// counted once, and the next copy runs at attempt 2.
	t.Run("fail", func(t *testing.T) {
		t.Parallel()
		s, p := proxiedRedisStore(t, nil)
		ctx := context.Background()
		r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-fail", "", "x"), func(context.Context, *dedup.Message) error {
			p.DropReplyOnce(finishAs(string(dedup.StatusFailedRetryable)))
			return errors.New("provider timeout")
		}, dedup.LeaseOptions{})
		p.WaitDropped(1)
		if err != nil || r.Outcome != dedup.OutcomeRetry || r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 {
			t.Fatalf("%+v, %v; want retry, FAILED_RETRYABLE at attempt 1", r, err)
		}
		rec, err := s.Lookup(ctx, "billing", "m-fail")
		if err != nil || rec.Status != dedup.StatusFailedRetryable || rec.Attempts != 1 || rec.LastError != "provider timeout" {
			t.Fatalf("record = %+v, %v; want FAILED_RETRYABLE, attempts 1, the error", rec, err)
		}
		if r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-fail", "", "x"), ok, dedup.LeaseOptions{}); err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 2 {
			t.Fatalf("next copy: %+v, %v; want processed at attempt 2", r, err)
		}
	})

	// A permanent failure: the retried mark answers the dead letter its
	// first run wrote; there is one.
	t.Run("fail-final", func(t *testing.T) {
		t.Parallel()
		s, p := proxiedRedisStore(t, nil)
		ctx := context.Background()
		r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-final", "", "x"), func(context.Context, *dedup.Message) error {
			p.DropReplyOnce(finishAs(string(dedup.StatusFailedFinal)))
			return dedup.Permanent(errors.New("card refused"))
		}, dedup.LeaseOptions{})
		p.WaitDropped(1)
		if err != nil || r.Outcome != dedup.OutcomeDeadLetter || r.Status != dedup.StatusFailedFinal {
			t.Fatalf("%+v, %v; want a dead letter", r, err)
		}
		oneDeadLetter(t, s, r, dedup.ReasonPermanentError)
	})

	// A shutdown's release: the retried release answers "released" (no
	// warning that the lease was lost), and the attempt is given back once.
	t.Run("release", func(t *testing.T) {
		t.Parallel()
		logs := &logBuffer{}
		s, p := proxiedRedisStore(t, func(c *redisstore.Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
		ctx, cancel := context.WithCancel(context.Background())
		_, err := s.ProcessLeased(ctx, msg(t, "billing", "m-stop", "", "x"), func(hctx context.Context, _ *dedup.Message) error {
			p.DropReplyOnce(finishAs("RELEASE"))
			cancel()
			<-hctx.Done()
			return hctx.Err()
		}, dedup.LeaseOptions{})
		p.WaitDropped(1)
		if err == nil {
			t.Fatal("interrupted handler: nil error, want one (do not ack)")
		}
		if strings.Contains(logs.String(), "release lease") {
			t.Fatalf("the release was answered as failed: %s", logs.String())
		}
		if rec, err := s.Lookup(context.Background(), "billing", "m-stop"); err != nil || rec.Status != dedup.StatusFailedRetryable || rec.Attempts != 0 {
			t.Fatalf("record after the release = %+v, %v; want FAILED_RETRYABLE, attempts 0", rec, err)
		}
	})

	// The operator's re-drive: the retried one answers done, not "the record
	// is FAILED_RETRYABLE".
	t.Run("redrive", func(t *testing.T) {
		t.Parallel()
		s, p := proxiedRedisStore(t, nil)
		ctx := context.Background()
		if r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-redrive", "", "x"), func(context.Context, *dedup.Message) error {
			return dedup.Permanent(errors.New("card refused"))
		}, dedup.LeaseOptions{}); err != nil || r.Outcome != dedup.OutcomeDeadLetter {
			t.Fatalf("first copy: %+v, %v", r, err)
		}
		p.DropReplyOnce(redriveCall)
		err := s.Redrive(ctx, "billing", "m-redrive")
		p.WaitDropped(1)
		if err != nil {
			t.Fatalf("Redrive = %v, want nil", err)
		}
		if rec, err := s.Lookup(ctx, "billing", "m-redrive"); err != nil || rec.Status != dedup.StatusFailedRetryable {
			t.Fatalf("record = %+v, %v; want FAILED_RETRYABLE", rec, err)
		}
		if r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-redrive", "", "x"), ok, dedup.LeaseOptions{}); err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 2 {
			t.Fatalf("copy after the re-drive: %+v, %v; want processed at attempt 2", r, err)
		}
	})

	// A rejection (bad input): the retried one answers the dead letter its
	// first run wrote, not "duplicate"; the record kept the payload's
	// fingerprint, so once re-driven the next copy runs.
	t.Run("reject", func(t *testing.T) {
		t.Parallel()
		s, p := proxiedRedisStore(t, nil)
		ctx := context.Background()
		p.DropReplyOnce(rejectCall(dedup.ReasonBadInput))
		r, err := s.Reject(ctx, msg(t, "billing", "m-bad", "", "x"), dedup.ReasonBadInput, errors.New("no business key"))
		p.WaitDropped(1)
		if err != nil || r.Outcome != dedup.OutcomeDeadLetter || r.Status != dedup.StatusFailedFinal {
			t.Fatalf("%+v, %v; want a dead letter", r, err)
		}
		oneDeadLetter(t, s, r, dedup.ReasonBadInput)
		if err := s.Redrive(ctx, "billing", "m-bad"); err != nil {
			t.Fatal(err)
		}
		if r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-bad", "", "x"), ok, dedup.LeaseOptions{}); err != nil || r.Outcome != dedup.OutcomeProcessed {
			t.Fatalf("copy after the re-drive: %+v, %v; want processed", r, err)
		}
	})
}

// waitLeaseGone waits until Redis has dropped the lease of messageID (its
// TTL ran out).
func waitLeaseGone(t *testing.T, s *redisstore.Store, messageID string) {
	t.Helper()
	c := redisClient(t)
	ctx := context.Background()
	eventually(t, 30*time.Second, "Redis to drop the lease of "+messageID, func() bool {
		n := 0
		iter := c.Scan(ctx, 0, s.Config().Prefix+":*:lease:"+messageID, 100).Iterator()
		for iter.Next(ctx) {
			n++
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// The Redis fast path's Remember is a pipeline of SETs, which go-redis
// sends again whole when the reply is lost: a SET of the same value and TTL
// is the same write twice. The identity is remembered and Remember reports
// no error.
func TestRedisFastPathRememberReplyLost(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, redisAddress(t), faultproxy.RESP)
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	prefix := randomName("fp-")
	fp, err := redisfast.New(redisfast.Config{Client: c, Prefix: prefix, Timeout: time.Second}) // the most New allows; the drop costs a reconnect, not a wait
	if err != nil {
		t.Fatal(err)
	}
	direct := redisClient(t)
	t.Cleanup(func() {
		iter := direct.Scan(context.Background(), 0, prefix+":*", 100).Iterator()
		for iter.Next(context.Background()) {
			_ = direct.Del(context.Background(), iter.Val()).Err()
		}
	})
	ctx := context.Background()
	id := dedup.Identity{Scope: "billing", MessageID: "m-1", BusinessKey: "pay-1"}
	entry := dedup.FastPathEntry{KeyID: "k1", Fingerprint: []byte{1, 2, 3}}
	p.DropReplyOnce(func(req []byte) bool {
		args := faultproxy.RESPArgs(req)
		return len(args) > 1 && strings.EqualFold(args[0], "set") && strings.HasSuffix(args[1], ":m:m-1")
	})
	if err := fp.Remember(ctx, id, entry); err != nil {
		t.Fatalf("Remember = %v, want nil (go-redis sends the pipeline again)", err)
	}
	p.WaitDropped(1)
	for _, other := range []dedup.Identity{id, {Scope: "billing", MessageID: "m-2", BusinessKey: "pay-1"}} {
		got, hit, err := fp.Lookup(ctx, other)
		if err != nil || !hit || got.KeyID != "k1" || !bytes.Equal(got.Fingerprint, entry.Fingerprint) {
			t.Fatalf("Lookup(%s) = %+v, %v, %v; want the entry", other, got, hit, err)
		}
	}
	for _, key := range []string{fp.Key("billing", "m", "m-1"), fp.Key("billing", "b", "pay-1")} {
		if ttl, err := direct.PTTL(ctx, key).Result(); err != nil || ttl <= 0 || ttl > fp.TTL() {
			t.Fatalf("TTL of %s = %s, %v; want within (0, %s]", key, ttl, err, fp.TTL())
		}
	}
}
