package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/wire"
	"github.com/redis/go-redis/v9"
)

// The Redis-only store (dedup/redisstore) on a real Redis: records, leases and
// dead letters live in Redis, under a fresh key prefix per test.

func newRedisStore(t testing.TB, tweak func(*redisstore.Config)) *redisstore.Store {
	t.Helper()
	c := redisClient(t)
	prefix := randomName("rs-")
	cfg := redisstore.Config{Client: c, Prefix: prefix, Fingerprinter: testFingerprinter(t)}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := redisstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			_ = c.Del(ctx, iter.Val()).Err()
		}
	})
	return s
}

// effects is a stand-in for an external system: it applies each idempotency
// key once and counts every request.
type effects struct {
	mu       sync.Mutex
	requests map[string]int
	fences   map[string][]int64
}

func newEffects() *effects {
	return &effects{requests: map[string]int{}, fences: map[string][]int64{}}
}

func (f *effects) request(ctx context.Context) error {
	l, ok := dedup.LeaseFromContext(ctx)
	if !ok {
		return errors.New("no lease in context")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests[l.IdempotencyKey()]++
	f.fences[l.IdempotencyKey()] = append(f.fences[l.IdempotencyKey()], l.Fence)
	return nil
}

func (f *effects) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.requests {
		n += c
	}
	return n
}

// 20 goroutines deliver the same message at once: one runs the handler,
// the others see a live lease (retry) or, once it succeeded, a duplicate;
// redelivering the retries until acked never runs the handler again.
func TestRedisStoreConcurrentCopiesApplyOnce(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	fx := newEffects()
	h := func(ctx context.Context, _ *dedup.Message) error {
		time.Sleep(100 * time.Millisecond)
		return fx.request(ctx)
	}
	ctx := context.Background()
	var processed, duplicates, retries atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				res, err := s.ProcessLeased(ctx, msg(t, "billing", "m-1", "pay-1", `{"amount":40}`), h, dedup.LeaseOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				switch res.Outcome {
				case dedup.OutcomeProcessed:
					processed.Add(1)
				case dedup.OutcomeDuplicate:
					duplicates.Add(1)
				case dedup.OutcomeRetry:
					if !errors.Is(res.Err, dedup.ErrLeaseHeld) {
						t.Errorf("retry with %v, want ErrLeaseHeld", res.Err)
						return
					}
					retries.Add(1)
					time.Sleep(20 * time.Millisecond) // the broker redelivers later
					continue
				default:
					t.Errorf("outcome %s", res.Outcome)
				}
				return
			}
		}()
	}
	wg.Wait()
	if processed.Load() != 1 || duplicates.Load() != 19 || fx.total() != 1 {
		t.Fatalf("processed %d, duplicates %d, handler effects %d; want 1, 19, 1", processed.Load(), duplicates.Load(), fx.total())
	}
	if retries.Load() == 0 {
		t.Fatal("no copy ever found the live lease: the copies did not overlap")
	}
	rec, err := s.Lookup(ctx, "billing", "m-1")
	if err != nil || rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 || rec.Fence != 1 || rec.ExpiresAt == nil {
		t.Fatalf("record = %+v, %v; want SUCCEEDED, 1 attempt, fence 1, an expiry", rec, err)
	}
}

// Duplicates by message ID and by business key, and a conflict: same
// identity, different payload, dead-lettered whole and never applied.
func TestRedisStoreDuplicatesAndConflicts(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	fx := newEffects()
	h := func(ctx context.Context, _ *dedup.Message) error { return fx.request(ctx) }
	ctx := context.Background()
	run := func(mid, bk, payload string) dedup.Result {
		t.Helper()
		res, err := s.ProcessLeased(ctx, msg(t, "billing", mid, bk, payload), h, dedup.LeaseOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if r := run("m-1", "pay-1", `{"amount":40}`); r.Outcome != dedup.OutcomeProcessed || !r.HandlerCalled {
		t.Fatalf("first copy: %+v", r)
	}
	if r := run("m-1", "pay-1", `{"amount":40}`); r.Outcome != dedup.OutcomeDuplicate || r.MatchedBy != dedup.ByMessageID || r.HandlerCalled {
		t.Fatalf("same message again: %+v", r)
	}
	if r := run("m-2", "pay-1", `{"amount":40}`); r.Outcome != dedup.OutcomeDuplicate || r.MatchedBy != dedup.ByBusinessKey {
		t.Fatalf("producer re-send under a new message ID: %+v", r)
	}
	r := run("m-1", "pay-1", `{"amount":45}`)
	if r.Outcome != dedup.OutcomeConflict || !errors.Is(r.Err, dedup.ErrFingerprintConflict) || !errors.Is(r.Err, dedup.ErrPayloadConflict) ||
		r.Reason != dedup.ReasonPayloadConflict || r.DeadLetterID == 0 || !r.Outcome.Acked() {
		t.Fatalf("conflicting payload: %+v", r)
	}
	if r := run("m-3", "pay-1", `{"amount":99}`); r.Outcome != dedup.OutcomeConflict || r.MatchedBy != dedup.ByBusinessKey {
		t.Fatalf("same business key, other payload: %+v", r)
	}
	if fx.total() != 1 {
		t.Fatalf("handler effects = %d, want 1", fx.total())
	}
	dls, err := s.DeadLetters(ctx, "billing", 0, 10)
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters = %+v, %v; want 2", dls, err)
	}
	d := dls[0]
	if d.ID != r.DeadLetterID || dls[1].ID <= d.ID || d.Reason != dedup.ReasonPayloadConflict || dls[1].Reason != dedup.ReasonPayloadConflict || string(d.Payload) != `{"amount":45}` ||
		d.MessageID != "m-1" || d.Topic != "payments" || d.Headers[wire.MessageIDHeader] != "m-1" {
		t.Fatalf("conflict dead letter = %+v", d)
	}
	if rest, _ := s.DeadLetters(ctx, "billing", d.ID, 10); len(rest) != 1 || rest[0].MessageID != "m-3" {
		t.Fatalf("dead letters after %d = %+v, want m-3's", d.ID, rest)
	}
	if rec, err := s.LookupBusinessKey(ctx, "billing", "pay-1"); err != nil || rec.MessageID != "m-1" {
		t.Fatalf("LookupBusinessKey = %+v, %v", rec, err)
	}
	if _, err := s.Lookup(ctx, "billing", "m-2"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("m-2 (a duplicate by business key) has its own record: %v", err)
	}
}

// Retryable failures are counted; the last allowed one, or a permanent
// error, is final with a dead letter; copies of a final record are acked
// without running the handler.
func TestRedisStoreFailuresRetriesAndDeadLetters(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = 3 })
	ctx := context.Background()
	calls := map[string]int{}
	h := func(_ context.Context, m *dedup.Message) error {
		id := m.Identity.MessageID
		calls[id]++
		switch {
		case id == "m-flaky" && calls[id] <= 2:
			return errors.New("provider timeout")
		case id == "m-poison":
			return errors.New("always fails")
		case id == "m-bad":
			return dedup.Permanent(errors.New("card declined"))
		}
		return nil
	}
	run := func(mid string) dedup.Result {
		t.Helper()
		res, err := s.ProcessLeased(ctx, msg(t, "billing", mid, "", "p-"+mid), h, dedup.LeaseOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for i, want := range []dedup.Outcome{dedup.OutcomeRetry, dedup.OutcomeRetry, dedup.OutcomeProcessed, dedup.OutcomeDuplicate} {
		if r := run("m-flaky"); r.Outcome != want || (i < 3 && r.Attempts != i+1) {
			t.Fatalf("m-flaky copy %d: %+v, want %s", i+1, r, want)
		}
	}
	if rec, _ := s.Lookup(ctx, "billing", "m-flaky"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 3 || rec.LastError != "provider timeout" {
		t.Fatalf("m-flaky record = %+v", rec)
	}
	for i, want := range []dedup.Outcome{dedup.OutcomeRetry, dedup.OutcomeRetry, dedup.OutcomeDeadLetter} {
		if r := run("m-poison"); r.Outcome != want || r.Attempts != i+1 {
			t.Fatalf("m-poison copy %d: %+v, want %s at attempt %d", i+1, r, want, i+1)
		}
	}
	if r := run("m-bad"); r.Outcome != dedup.OutcomeDeadLetter || r.Attempts != 1 || r.DeadLetterID == 0 {
		t.Fatalf("m-bad: %+v", r)
	}
	if r := run("m-poison"); r.Outcome != dedup.OutcomeDuplicate || r.Status != dedup.StatusFailedFinal || r.HandlerCalled {
		t.Fatalf("m-poison after final: %+v", r)
	}
	if calls["m-flaky"] != 3 || calls["m-poison"] != 3 || calls["m-bad"] != 1 {
		t.Fatalf("handler calls = %v", calls)
	}
	dls, err := s.DeadLetters(ctx, "billing", 0, 10)
	if err != nil || len(dls) < 2 || dls[0].Reason != dedup.ReasonAttemptsExhausted || dls[0].Attempts != 3 ||
		dls[1].Reason != dedup.ReasonPermanentError || string(dls[1].Payload) != "p-m-bad" {
		t.Fatalf("dead letters = %+v, %v", dls, err)
	}
	// An operator re-drives the poison message: the next copy runs the
	// handler once more (attempt 4), which fails and is final again.
	if err := s.Redrive(ctx, "billing", "m-poison"); err != nil {
		t.Fatal(err)
	}
	if r := run("m-poison"); r.Outcome != dedup.OutcomeDeadLetter || r.Attempts != 4 || !r.HandlerCalled || calls["m-poison"] != 4 {
		t.Fatalf("m-poison after re-drive: %+v, calls %d; want the handler run once more, then final", r, calls["m-poison"])
	}
	if err := s.Redrive(ctx, "billing", "m-flaky"); !errors.Is(err, dedup.ErrNotFinal) {
		t.Fatalf("Redrive of a SUCCEEDED record = %v, want ErrNotFinal", err)
	}
	if err := s.Redrive(ctx, "billing", "m-none"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("Redrive of no record = %v, want ErrNotFound", err)
	}
	// Bad input is rejected without a handler and kept.
	bad := msg(t, "billing", "m-garbage", "", "\x00\x01")
	if r, err := s.Reject(ctx, bad, dedup.ReasonBadInput, errors.New("unparsable payload")); err != nil || r.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("Reject = %+v, %v", r, err)
	}
	if r, _ := s.Reject(ctx, bad, dedup.ReasonBadInput, nil); r.Outcome != dedup.OutcomeDuplicate {
		t.Fatalf("Reject of a rejected copy = %+v, want duplicate", r)
	}
}

// S13 on Redis: owner A stalls without renewing; its lease expires; copy B
// takes over (fence 2, same idempotency key) and completes; A's context was
// canceled with ErrLeaseExpired and its completion is fenced (not acked).
func TestRedisStoreLeaseTakeoverFencesStaleOwner(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	fx := newEffects()
	ctx := context.Background()
	opt := dedup.LeaseOptions{TTL: time.Second, DisableHeartbeat: true}
	type outcome struct {
		res   dedup.Result
		err   error
		cause error
	}
	aDone := make(chan outcome, 1)
	claimed := make(chan struct{})
	go func() {
		var cause error
		res, err := s.ProcessLeased(ctx, msg(t, "billing", "m-13", "charge-13", "x"), func(hctx context.Context, _ *dedup.Message) error {
			close(claimed)
			if err := fx.request(hctx); err != nil {
				return err
			}
			<-hctx.Done() // canceled at 90% of the TTL
			cause = context.Cause(hctx)
			time.Sleep(1500 * time.Millisecond) // a handler that keeps going anyway
			return nil
		}, opt)
		aDone <- outcome{res, err, cause}
	}()
	<-claimed
	if r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-13", "charge-13", "x"), fx.noop, opt); err != nil || r.Outcome != dedup.OutcomeRetry || !errors.Is(r.Err, dedup.ErrLeaseHeld) {
		t.Fatalf("copy during A's live lease: %+v, %v", r, err)
	}
	time.Sleep(1200 * time.Millisecond) // A's lease is gone
	rb, err := s.ProcessLeased(ctx, msg(t, "billing", "m-13", "charge-13", "x"), func(hctx context.Context, _ *dedup.Message) error {
		return fx.request(hctx)
	}, opt)
	if err != nil || rb.Outcome != dedup.OutcomeProcessed || rb.Attempts != 2 {
		t.Fatalf("B's takeover: %+v, %v; want processed at attempt 2", rb, err)
	}
	a := <-aDone
	if a.err != nil || a.res.Outcome != dedup.OutcomeFenced || !errors.Is(a.res.Err, dedup.ErrFenced) || a.res.Outcome.Acked() {
		t.Fatalf("A: %+v, %v; want fenced, not acked", a.res, a.err)
	}
	if !errors.Is(a.cause, dedup.ErrLeaseExpired) {
		t.Fatalf("A's context cause = %v, want ErrLeaseExpired", a.cause)
	}
	rec, _ := s.Lookup(ctx, "billing", "m-13")
	key := dedup.Lease{Identity: msg(t, "billing", "m-13", "charge-13", "x").Identity}.IdempotencyKey()
	if rec.Status != dedup.StatusSucceeded || rec.Fence != 2 || fmt.Sprint(fx.fences[key]) != "[1 2]" {
		t.Fatalf("record %+v, provider saw fences %v under one key; want SUCCEEDED, fence 2, [1 2]", rec, fx.fences[key])
	}
}

func (f *effects) noop(context.Context, *dedup.Message) error {
	return errors.New("must not run")
}

// The watchdog keeps a long handler's lease: copies meanwhile wait (retry),
// nobody takes over, the handler completes.
func TestRedisStoreWatchdogKeepsLongHandler(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	fx := newEffects()
	ctx := context.Background()
	// Renewals every 300ms keep a 2s lease through a 4s handler, with room
	// for a slow machine; a lease that lapsed would let a copy take over.
	opt := dedup.LeaseOptions{TTL: 2 * time.Second, Heartbeat: 300 * time.Millisecond}
	done := make(chan dedup.Result, 1)
	go func() {
		res, err := s.ProcessLeased(ctx, msg(t, "billing", "m-long", "", "x"), func(hctx context.Context, _ *dedup.Message) error {
			select {
			case <-time.After(4 * time.Second):
				return fx.request(hctx)
			case <-hctx.Done():
				return context.Cause(hctx)
			}
		}, opt)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	for range 5 {
		time.Sleep(700 * time.Millisecond)
		if r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-long", "", "x"), fx.noop, opt); err != nil || r.Outcome != dedup.OutcomeRetry ||
			!errors.Is(r.Err, dedup.ErrLeaseHeld) || r.HandlerCalled {
			t.Fatalf("copy while the owner renews: %+v, %v; want retry on the held lease, handler not run", r, err)
		}
	}
	if r := <-done; r.Outcome != dedup.OutcomeProcessed || r.Attempts != 1 || fx.total() != 1 {
		t.Fatalf("owner: %+v, effects %d", r, fx.total())
	}
}

// A message that kills its consumer: every owner dies holding the lease.
// Takeovers count attempts; after the last one the record is final with a
// dead letter, so the message stops coming back.
func TestRedisStoreOwnerThatNeverReturnsIsBounded(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = 2 })
	ctx := context.Background()
	opt := dedup.LeaseOptions{TTL: time.Second, DisableHeartbeat: true}
	release := make(chan struct{})
	defer close(release)
	var running sync.WaitGroup
	hang := func(context.Context, *dedup.Message) error { running.Done(); <-release; return nil }
	for attempt := 1; attempt <= 2; attempt++ {
		running.Add(1)
		go func() { _, _ = s.ProcessLeased(ctx, msg(t, "billing", "m-kill", "", "x"), hang, opt) }()
		running.Wait() // the owner holds the lease, then "dies" (never returns)
		time.Sleep(1200 * time.Millisecond)
	}
	r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-kill", "", "x"), func(context.Context, *dedup.Message) error {
		return errors.New("must not run")
	}, opt)
	if err != nil || r.Outcome != dedup.OutcomeDeadLetter || r.Attempts != 2 || r.HandlerCalled || r.DeadLetterID == 0 {
		t.Fatalf("copy after two dead owners: %+v, %v; want dead letter after 2 attempts, handler not run", r, err)
	}
	dls, _ := s.DeadLetters(ctx, "billing", 0, 10)
	if len(dls) != 1 || dls[0].Reason != dedup.ReasonAttemptsExhausted {
		t.Fatalf("dead letters = %+v", dls)
	}
	if rec, _ := s.Lookup(ctx, "billing", "m-kill"); rec.Status != dedup.StatusFailedFinal || rec.Fence != 2 {
		t.Fatalf("record = %+v", rec)
	}
}

// Shutdown during a handler gives the lease back without counting the
// attempt; Redis unreachable means "not recorded, do not ack", handler not
// run.
func TestRedisStoreShutdownAndRedisDown(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := s.ProcessLeased(ctx, msg(t, "billing", "m-stop", "", "x"), func(hctx context.Context, _ *dedup.Message) error {
		cancel()
		<-hctx.Done()
		return hctx.Err()
	}, dedup.LeaseOptions{})
	if err == nil {
		t.Fatal("interrupted handler: nil error, want one (do not ack)")
	}
	if rec, _ := s.Lookup(context.Background(), "billing", "m-stop"); rec.Status != dedup.StatusFailedRetryable || rec.Attempts != 0 {
		t.Fatalf("record after shutdown = %+v; want FAILED_RETRYABLE, attempts 0", rec)
	}
	r, err := s.ProcessLeased(context.Background(), msg(t, "billing", "m-stop", "", "x"), func(context.Context, *dedup.Message) error { return nil }, dedup.LeaseOptions{})
	if err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 1 {
		t.Fatalf("next copy: %+v, %v; want processed at attempt 1", r, err)
	}

	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer down.Close()
	ds, err := redisstore.New(redisstore.Config{Client: down, Fingerprinter: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
	called := false
	_, err = ds.ProcessLeased(context.Background(), msg(t, "billing", "m-x", "", "x"), func(context.Context, *dedup.Message) error { called = true; return nil }, dedup.LeaseOptions{})
	if err == nil || called {
		t.Fatalf("Redis down: err %v, handler called %v; want an error and no call", err, called)
	}
}

// End to end on a real Kafka broker: a lease-mode consumer on the Redis
// store, duplicates by message ID and by business key, then the whole topic
// replayed by a second consumer group of the same scope: every payment
// reaches the "provider" once.
func TestRedisStoreKafkaConsumerAppliesOnce(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	fx := newEffects()
	topic := newTopic(t, 3)
	var msgs []kmsg
	for i := range 30 {
		m := kmsg{id: fmt.Sprintf("m-%02d", i), payload: fmt.Sprintf(`{"payment_id":"pay-%02d"}`, i)}
		msgs = append(msgs, m)
		if i%5 == 0 {
			msgs = append(msgs, m) // producer retry: same message ID
		}
		if i%7 == 0 {
			msgs = append(msgs, kmsg{id: fmt.Sprintf("m-%02d-resend", i), payload: m.payload}) // re-send: new ID, same payment
		}
	}
	produce(t, topic, msgs...)
	scope := randomName("g-")
	bk := func(m *dedup.Message) (string, error) {
		var v struct {
			PaymentID string `json:"payment_id"`
		}
		err := json.Unmarshal(m.Payload, &v)
		return v.PaymentID, err
	}
	for round, group := range []string{scope, randomName("g-replay-")} {
		var counters consumer.Counters
		r := startConsumer(t, consumer.Config{Scope: scope, Store: s, BusinessKey: bk, Metrics: &counters,
			LeaseHandler: func(ctx context.Context, _ *dedup.Message) error { return fx.request(ctx) }}, newSpySource(t, group, topic))
		waitCaughtUp(t, group, topic)
		r.stop(t)
		snap := counters.Snapshot()
		if round == 0 && (snap["processed"] != 30 || snap["duplicate"] != int64(len(msgs)-30)) {
			t.Fatalf("first pass counters %v; want 30 processed, %d duplicates", snap, len(msgs)-30)
		}
		if round == 1 && (snap["processed"] != 0 || snap["duplicate"] != int64(len(msgs))) {
			t.Fatalf("replay counters %v; want every delivery a duplicate", snap)
		}
	}
	if len(fx.requests) != 30 || fx.total() != 30 {
		t.Fatalf("provider saw %d keys, %d requests; want 30 and 30", len(fx.requests), fx.total())
	}
}

// A re-send under a new message ID that takes over a failed record by
// business key sends the downstream system the same idempotency key as the
// first execution (the record's), so the provider can drop the repeat.
func TestRedisStoreTakeoverByBusinessKeyKeepsIdempotencyKey(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	ctx := context.Background()
	takeoverByBusinessKeyKeepsIdempotencyKey(t, ctx, s)
	if rec, _ := s.Lookup(ctx, "billing", "m-1"); rec.Status != dedup.StatusSucceeded || rec.Fence != 2 {
		t.Fatalf("m-1's record = %+v", rec)
	}
}

// Fingerprint key rotation, with key IDs holding a space and a colon: a
// record made under the previous key still matches its payload, another
// payload is still a conflict, and Lookup shows the key ID whole.
func TestRedisStoreFingerprintKeyRotation(t *testing.T) {
	t.Parallel()
	oldKey := dedup.FingerprintKey{ID: "key 2025:a", Secret: []byte("old-secret-0123456789")}
	newKey := dedup.FingerprintKey{ID: "key 2026:b", Secret: []byte("new-secret-0123456789")}
	before, _ := dedup.NewFingerprinter(nil, oldKey)
	after, _ := dedup.NewFingerprinter(nil, newKey, oldKey)
	s1 := newRedisStore(t, func(c *redisstore.Config) { c.Fingerprinter = before })
	cfg := s1.Config()
	cfg.Fingerprinter = after
	s2, err := redisstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ok := func(context.Context, *dedup.Message) error { return nil }
	if r, _ := s1.ProcessLeased(ctx, msg(t, "billing", "m-1", "pay-1", `{"amount":40}`), ok, dedup.LeaseOptions{}); r.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("first: %+v", r)
	}
	if rec, _ := s2.Lookup(ctx, "billing", "m-1"); rec.FingerprintKeyID != "key 2025:a" || len(rec.Fingerprint) != 32 {
		t.Fatalf("record fingerprint key %q, %d bytes", rec.FingerprintKeyID, len(rec.Fingerprint))
	}
	if r, _ := s2.ProcessLeased(ctx, msg(t, "billing", "m-1", "pay-1", `{"amount":40}`), ok, dedup.LeaseOptions{}); r.Outcome != dedup.OutcomeDuplicate {
		t.Fatalf("same payload after rotation: %+v, want duplicate", r)
	}
	for _, m := range []*dedup.Message{msg(t, "billing", "m-1", "pay-1", `{"amount":9999}`), msg(t, "billing", "m-2", "pay-1", `{"amount":9999}`)} {
		if r, _ := s2.ProcessLeased(ctx, m, ok, dedup.LeaseOptions{}); r.Outcome != dedup.OutcomeConflict {
			t.Fatalf("%s with another payload after rotation: %+v, want conflict", m.Identity, r)
		}
	}
}

// Repeated copies of one conflicting message leave one dead letter.
func TestRedisStoreConflictDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	ctx := context.Background()
	ok := func(context.Context, *dedup.Message) error { return nil }
	_, _ = s.ProcessLeased(ctx, msg(t, "billing", "m-1", "", "a"), ok, dedup.LeaseOptions{})
	for i := range 3 {
		r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-1", "", "b"), ok, dedup.LeaseOptions{})
		if err != nil || r.Outcome != dedup.OutcomeConflict || (i == 0) != (r.DeadLetterID != 0) {
			t.Fatalf("conflicting copy %d: %+v, %v; want a dead letter the first time only", i+1, r, err)
		}
	}
	if r, _ := s.ProcessLeased(ctx, msg(t, "billing", "m-1", "", "c"), ok, dedup.LeaseOptions{}); r.DeadLetterID == 0 {
		t.Fatalf("a third payload is another conflict: %+v, want its own dead letter", r)
	}
	if dls, _ := s.DeadLetters(ctx, "billing", 0, 10); len(dls) != 2 {
		t.Fatalf("dead letters = %d, want 2", len(dls))
	}
}

// Bad input takes part in business-key dedup: a rejected message's business
// key makes a later message with it a conflict, a rejected re-send of a
// succeeded payment is a duplicate, and a record whose owner died is made
// final by a rejection instead of waiting forever.
func TestRedisStoreRejectUsesBusinessKeyAndDeadOwners(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	ctx := context.Background()
	ok := func(context.Context, *dedup.Message) error { return nil }
	if r, err := s.Reject(ctx, msg(t, "billing", "m-1", "pay-1", "garbage"), dedup.ReasonBadInput, errors.New("unparsable")); err != nil || r.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("reject m-1: %+v, %v", r, err)
	}
	if r, _ := s.ProcessLeased(ctx, msg(t, "billing", "m-2", "pay-1", "fine"), ok, dedup.LeaseOptions{}); r.Outcome != dedup.OutcomeConflict || r.MatchedBy != dedup.ByBusinessKey {
		t.Fatalf("m-2 with the rejected business key: %+v, want a conflict by business key", r)
	}
	if r, _ := s.ProcessLeased(ctx, msg(t, "billing", "m-3", "pay-3", "fine"), ok, dedup.LeaseOptions{}); r.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("m-3: %+v", r)
	}
	if r, _ := s.Reject(ctx, msg(t, "billing", "m-4", "pay-3", "garbage"), dedup.ReasonBadInput, nil); r.Outcome != dedup.OutcomeDuplicate || r.MatchedBy != dedup.ByBusinessKey {
		t.Fatalf("rejected re-send of a succeeded payment: %+v, want duplicate by business key", r)
	}
	// An owner dies holding m-5's lease (1s, no renewal).
	claimed, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	go func() {
		_, _ = s.ProcessLeased(ctx, msg(t, "billing", "m-5", "", "x"), func(context.Context, *dedup.Message) error {
			close(claimed)
			<-release // dead: does not return while the test runs
			return nil
		}, dedup.LeaseOptions{TTL: time.Second, DisableHeartbeat: true})
	}()
	<-claimed
	if r, _ := s.Reject(ctx, msg(t, "billing", "m-5", "", "x"), dedup.ReasonBadInput, nil); r.Outcome != dedup.OutcomeRetry {
		t.Fatalf("reject while the owner's lease is live: %+v, want retry", r)
	}
	time.Sleep(1200 * time.Millisecond)
	if r, _ := s.Reject(ctx, msg(t, "billing", "m-5", "", "x"), dedup.ReasonBadInput, nil); r.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("reject after the owner died: %+v, want dead letter", r)
	}
}

// A business-key index whose record expired first does not block the key:
// the next message with it runs as new and the index moves to it.
func TestRedisStoreStaleBusinessKeyIndex(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	ctx := context.Background()
	ok := func(context.Context, *dedup.Message) error { return nil }
	if r, _ := s.ProcessLeased(ctx, msg(t, "billing", "m-1", "pay-1", "x"), ok, dedup.LeaseOptions{}); r.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("m-1: %+v", r)
	}
	c := redisClient(t)
	iter := c.Scan(ctx, 0, s.Config().Prefix+":*:rec:m-1", 10).Iterator()
	for iter.Next(ctx) {
		_ = c.Del(ctx, iter.Val()).Err() // the record expired, its index not yet
	}
	if r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-2", "pay-1", "y"), ok, dedup.LeaseOptions{}); err != nil || r.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("m-2 after m-1's record expired: %+v, %v; want processed", r, err)
	}
	if rec, err := s.LookupBusinessKey(ctx, "billing", "pay-1"); err != nil || rec.MessageID != "m-2" {
		t.Fatalf("index now: %+v, %v; want m-2", rec, err)
	}
}

// The watchdog notices a takeover: its renewal finds another owner, and the
// handler's context ends with ErrFenced at once, not at lease expiry.
func TestRedisStoreWatchdogFencedByRenewal(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	ctx := context.Background()
	c := redisClient(t)
	var cause error
	start := time.Now()
	r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-1", "", "x"), func(hctx context.Context, _ *dedup.Message) error {
		iter := c.Scan(ctx, 0, s.Config().Prefix+":*:rec:m-1", 10).Iterator()
		for iter.Next(ctx) { // another owner takes the record over
			_ = c.HSet(ctx, iter.Val(), "owner", "someone-else", "fence", 2).Err()
		}
		<-hctx.Done()
		cause = context.Cause(hctx)
		return nil
	}, dedup.LeaseOptions{TTL: 10 * time.Second, Heartbeat: 100 * time.Millisecond})
	if err != nil || r.Outcome != dedup.OutcomeFenced || !errors.Is(cause, dedup.ErrFenced) || time.Since(start) > 5*time.Second {
		t.Fatalf("%+v, %v, cause %v after %s; want fenced by the first renewal", r, err, cause, time.Since(start))
	}
}

// failAfter is a go-redis hook that fails every command once armed.
type failAfter struct{ armed atomic.Bool }

func (f *failAfter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.armed.Load() {
			return errors.New("injected: connection reset")
		}
		return next(ctx, cmd)
	}
}
func (f *failAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Redis failing after the handler ran: the outcome is not recorded, so the
// delivery must not be acked (an error), and the next copy, once Redis is
// back and the lease expired, runs again.
func TestRedisStoreCompletionFailureIsNotAcked(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: redisAddress(t), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	hook := &failAfter{}
	c.AddHook(hook)
	s := newRedisStore(t, func(cfg *redisstore.Config) { cfg.Client = c })
	ctx := context.Background()
	opt := dedup.LeaseOptions{TTL: time.Second, DisableHeartbeat: true}
	_, err := s.ProcessLeased(ctx, msg(t, "billing", "m-1", "", "x"), func(context.Context, *dedup.Message) error {
		hook.armed.Store(true)
		return nil
	}, opt)
	if err == nil {
		t.Fatal("completion failed but ProcessLeased returned no error: the delivery would be acked")
	}
	hook.armed.Store(false)
	time.Sleep(1200 * time.Millisecond)
	r, err := s.ProcessLeased(ctx, msg(t, "billing", "m-1", "", "x"), func(context.Context, *dedup.Message) error { return nil }, opt)
	if err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 2 {
		t.Fatalf("next copy: %+v, %v; want processed at attempt 2", r, err)
	}
}

// RocketMQ in lease mode on the Redis-only store: a handler that fails
// twice goes through the real %RETRY% topic and succeeds at attempt 3, and
// a producer re-send (new UNIQ_KEY, same business key) is a duplicate.
func TestRedisStoreRocketMQRetryTopicAndResend(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, nil)
	fx := newEffects()
	group := randomName("it-rs-")
	topic := rmqTopic(t, "it-rs-", group)
	var calls atomic.Int64
	h := func(ctx context.Context, _ *dedup.Message) error {
		if calls.Add(1) <= 2 {
			return errors.New("provider timeout")
		}
		return fx.request(ctx)
	}
	obs := &rmqObserver{}
	rmqPushConsumer(t, rocketmqadapter.Config{
		Consumer: consumer.Config{Store: s, LeaseHandler: h, Lease: dedup.LeaseOptions{TTL: 5 * time.Second},
			BusinessKey: rocketmqadapter.BusinessKeyFromKeys},
		Group: group, Topic: topic, Observe: obs.observe,
	})
	p := rmqProducer(t)
	uniq := rmqSend(t, p, topic, []byte(`{"order":"o-1"}`), "", "o-1")
	eventually(t, 60*time.Second, "SUCCEEDED", func() bool {
		r, err := s.Lookup(context.Background(), group, uniq)
		return err == nil && r.Status == dedup.StatusSucceeded
	})
	resend := rmqSend(t, p, topic, []byte(`{"order":"o-1"}`), "", "o-1")
	eventually(t, 30*time.Second, "the re-send acked as a duplicate", func() bool {
		for _, o := range obs.all() {
			if o.d.MessageID == resend && o.res.Outcome == dedup.OutcomeDuplicate && o.res.MatchedBy == dedup.ByBusinessKey {
				return true
			}
		}
		return false
	})
	time.Sleep(2 * time.Second) // no stray handler runs
	r, _ := s.Lookup(context.Background(), group, uniq)
	if r.Attempts != 3 || r.ReconsumeTimes != 2 || calls.Load() != 3 || fx.total() != 1 {
		t.Fatalf("record attempts %d reconsume %d, handler calls %d, effects %d; want 3 2 3 1", r.Attempts, r.ReconsumeTimes, calls.Load(), fx.total())
	}
}
