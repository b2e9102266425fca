package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

// refusePub is a ChainPublisher that refuses every row of the keys in
// refuse (a permanent row error, not an unavailable broker) and
// acknowledges every other row. It records, per key, the payloads
// acknowledged in order and how many rows it refused.
type refusePub struct {
	refuse map[string]bool

	mu    sync.Mutex
	acked map[string][]string
	refd  map[string]int
}

func newRefusePub(keys ...string) *refusePub {
	p := &refusePub{refuse: map[string]bool{}, acked: map[string][]string{}, refd: map[string]int{}}
	for _, k := range keys {
		p.refuse[k] = true
	}
	return p
}

func (p *refusePub) Publish(context.Context, []Envelope) error {
	return errors.New("refusePub: PublishChains only")
}

func (p *refusePub) PublishChains(_ context.Context, chains [][]Envelope) []ChainResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ChainResult, len(chains))
	for i, c := range chains {
		for _, e := range c {
			if p.refuse[string(e.Key)] {
				p.refd[string(e.Key)]++
				out[i].Err = errors.New("broker refused the record: invalid record")
				break
			}
			p.acked[string(e.Key)] = append(p.acked[string(e.Key)], string(e.Payload))
			out[i].Acked++
		}
	}
	return out
}

func (p *refusePub) counts() (acked map[string][]string, refused map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	acked = map[string][]string{}
	for k, v := range p.acked {
		acked[k] = slices.Clone(v)
	}
	refused = map[string]int{}
	for k, v := range p.refd {
		refused[k] = v
	}
	return acked, refused
}

// addMessages commits msgs in one transaction.
func addMessages(t *testing.T, ctx context.Context, ob *Outbox, msgs []Message) {
	t.Helper()
	tx, err := ob.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := ob.AddBatch(ctx, tx, msgs); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// S31, poison heads: the publisher refuses every row of k-1…k-3 (a
// permanent row error), MaxKeys is 3, and the rows of k-4 and k-5 come after
// the refused ones, so the refused keys fill the claim's window. The batch
// right after the refusals (the relay's next poll) publishes every row of
// k-4 and k-5, in order, whether the refused heads are waiting out their
// retry delay ("backoff") or are due again at once ("due-again": a retry
// delay shorter than a batch; their retry time is still later than the
// other keys' rows, which have been due longer). The refused keys are
// retried only when their own retry time has come, each head is refused
// exactly MaxAttempts times and parked, their later rows are never sent
// (per-key order), and the breaker never opens (a refusal is the row's
// fault, not the broker's). Time is the database's: the retry delay is an
// hour, and the test brings the refused heads' retry time to now() itself,
// so nothing depends on how fast the machine is.
func TestRelayPoisonHeadsDoNotStarveOtherKeys(t *testing.T) {
	for _, dueAgain := range []bool{false, true} {
		name := map[bool]string{false: "backoff", true: "due-again"}[dueAgain]
		t.Run(name, func(t *testing.T) { testPoisonHeads(t, dueAgain) })
	}
}

func testPoisonHeads(t *testing.T, dueAgain bool) {
	ob, ctx := pgOutbox(t)
	const perPoison, maxAttempts = 3, 3
	var msgs []Message
	for i := range perPoison {
		for k := 1; k <= 3; k++ {
			msgs = append(msgs, Message{Topic: "t", Key: []byte(fmt.Sprintf("k-%d", k)), Payload: []byte(fmt.Sprint(i))})
		}
	}
	addMessages(t, ctx, ob, msgs)
	pub := newRefusePub("k-1", "k-2", "k-3")
	r, err := NewRelay(ob, pub, RelayConfig{MaxKeys: 3, BatchSize: 10, MaxAttempts: maxAttempts,
		RetryInitial: time.Hour, RetryMax: time.Hour, DisablePurge: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	// retryNow makes the refused heads due again (their retry time has
	// come, by the database's clock).
	retryNow := func() {
		t.Helper()
		if _, err := ob.pool.Exec(ctx, `update `+ob.q.table+` set available_at = now() where attempts > 0 and parked_at is null and published_at is null`); err != nil {
			t.Fatal(err)
		}
	}

	// Poll 1: the only rows are the refused keys'.
	res, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 3 || res.Published != 0 {
		t.Fatalf("poll 1: %+v; want the 3 refused heads failed, nothing published", res)
	}
	addMessages(t, ctx, ob, []Message{
		{Topic: "t", Key: []byte("k-4"), Payload: []byte("0")},
		{Topic: "t", Key: []byte("k-5"), Payload: []byte("0")},
		{Topic: "t", Key: []byte("k-4"), Payload: []byte("1")},
	})
	if dueAgain {
		retryNow()
	}
	// Poll 2: the refused heads must not take the batch's places from the
	// keys behind them.
	if res, err = r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	acked, refused := pub.counts()
	if res.Published != 3 || len(acked["k-4"]) != 2 || len(acked["k-5"]) != 1 {
		t.Fatalf("poll 2 (right after the refusals): %+v, acked %v, refused %v; want k-4's 2 rows and k-5's row published", res, acked, refused)
	}
	if !slices.Equal(acked["k-4"], []string{"0", "1"}) {
		t.Fatalf("k-4 acknowledged %v, want [0 1]", acked["k-4"])
	}
	if dueAgain {
		// The third place went to the refused head due the longest.
		if res.Failed != 1 {
			t.Fatalf("poll 2: %+v; want one refused head tried in the place left", res)
		}
	} else if res.Failed != 0 {
		t.Fatalf("poll 2: %+v; want no refused head tried before its retry time", res)
	}

	// The refused keys retry at their own pace: nothing due, nothing sent;
	// once their retry time has come each head is tried once more, until
	// it is parked.
	if !dueAgain {
		if res, err = r.RunOnce(ctx); err != nil || res != (BatchResult{}) {
			t.Fatalf("poll 3 (nothing due): %+v, %v; want an empty batch", res, err)
		}
	}
	for polls := 0; ; polls++ {
		st, err := ob.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Parked == 3 {
			break
		}
		if polls == 10 {
			t.Fatalf("after %d more polls: outbox %+v; want the 3 refused heads parked", polls, st)
		}
		retryNow()
		if res, err = r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if res.Published != 0 || res.Failed == 0 {
			t.Fatalf("retry poll %d: %+v; want only refused heads tried", polls, res)
		}
	}
	if res, err = r.RunOnce(ctx); err != nil || res != (BatchResult{}) {
		t.Fatalf("after parking: %+v, %v; want an empty batch", res, err)
	}

	acked, refused = pub.counts()
	for k := 1; k <= 3; k++ {
		key := fmt.Sprintf("k-%d", k)
		if refused[key] != maxAttempts || len(acked[key]) != 0 {
			t.Fatalf("%s: refused %d times, %d rows acknowledged; want its head refused %d times and nothing after it sent",
				key, refused[key], len(acked[key]), maxAttempts)
		}
	}
	parked, err := ob.Parked(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 3 {
		t.Fatalf("%d rows parked, want the 3 heads", len(parked))
	}
	for _, p := range parked {
		if string(p.Payload) != "0" || p.Attempts != maxAttempts {
			t.Fatalf("parked %s/%s after %d attempts; want only the heads (payload 0), after %d", p.Key, p.Payload, p.Attempts, maxAttempts)
		}
	}
	st, err := ob.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Published != 3 || st.Parked != 3 || st.Pending != 3*(perPoison-1) {
		t.Fatalf("outbox %+v; want 3 published, 3 parked, the refused keys' %d later rows pending", st, 3*(perPoison-1))
	}
	if rs := r.Stats(); rs.Outages != 0 || rs.BreakerOpen || rs.Unavailable != 0 || rs.Failed != 3*maxAttempts || rs.Parked != 3 {
		t.Fatalf("relay %+v; want %d failed publishes, 3 parked, the breaker never opened", rs, 3*maxAttempts)
	}
}

// Keys whose heads are not due (delayed, in backoff, parked) take no
// batch's place: with hundreds of them (a hundred times MaxKeys) sorting
// before the one ready key and filling the claim's window, one batch still
// finds and publishes that key.
func TestRelayManyBlockedKeysDoNotHideAReadyOne(t *testing.T) {
	ob, ctx := pgOutbox(t)
	const blocked = 300
	var msgs []Message
	for i := range blocked {
		msgs = append(msgs, Message{Topic: "t", Key: []byte(fmt.Sprintf("b-%04d", i)), Payload: []byte("0"), Delay: time.Hour})
	}
	addMessages(t, ctx, ob, msgs)
	addMessages(t, ctx, ob, []Message{{Topic: "t", Key: []byte("z"), Payload: []byte("0")}})
	pub := newRefusePub()
	r, err := NewRelay(ob, pub, RelayConfig{MaxKeys: 3, BatchSize: 10, DisablePurge: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 1 || res.Claimed != 1 {
		t.Fatalf("one batch: %+v; want key z's row published past the %d delayed keys", res, blocked)
	}
	// The cursor wrapped: the next batch finds nothing, and says so.
	if res, err = r.RunOnce(ctx); err != nil || res != (BatchResult{}) {
		t.Fatalf("second batch: %+v, %v; want an empty batch", res, err)
	}
}
