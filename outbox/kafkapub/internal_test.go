package kafkapub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/outbox"
)

func chain(topic, key string, n int, start int) []outbox.Envelope {
	var out []outbox.Envelope
	for i := range n {
		var k []byte
		if key != "" {
			k = []byte(key)
		}
		out = append(out, outbox.Envelope{Topic: topic, Key: k, Payload: []byte(fmt.Sprint(start + i))})
	}
	return out
}

// fakeProduce records requests and fails those whose payloads include fail
// (with an unavailable broker, as the real produce classifies
// NOT_ENOUGH_REPLICAS) or refuse (a row error, as a broker refusing a
// record fails its whole request).
type fakeProduce struct {
	mu           sync.Mutex
	reqs         []string
	fail, refuse string
}

func (f *fakeProduce) produce(_ context.Context, k tp, recs []pos) error {
	var vals []string
	for _, q := range recs {
		vals = append(vals, string(q.msg.Value))
	}
	s := fmt.Sprintf("%s/%d:%s", k.topic, k.partition, strings.Join(vals, ","))
	f.mu.Lock()
	f.reqs = append(f.reqs, s)
	f.mu.Unlock()
	for _, v := range vals {
		if v == f.fail {
			return outbox.Unavailable(errors.New("NOT_ENOUGH_REPLICAS"))
		}
		if v == f.refuse {
			return errors.New("INVALID_RECORD")
		}
	}
	return nil
}

// A refused record fails only its own chain: the request it shared with
// another key's records is sent again one chain at a time, the other key's
// records are acknowledged, and the refused chain's rows after it are
// never sent.
func TestPublishChainsRefusedRowFailsOnlyItsChain(t *testing.T) {
	f := &fakeProduce{refuse: "10"}
	p := newTestPublisher(t, 1<<20, f)
	res := p.PublishChains(context.Background(), [][]outbox.Envelope{chain("t", "a", 2, 0), chain("t", "b", 2, 10), chain("t", "c", 1, 20)})
	if got := strings.Join(f.reqs, " "); got != "t/0:0,1,10,11,20 t/0:0,1 t/0:10,11 t/0:20" {
		t.Fatalf("requests %s; want the shared request, then one per chain", got)
	}
	if res[0].Acked != 2 || res[0].Err != nil || res[2].Acked != 1 || res[2].Err != nil {
		t.Fatalf("results %+v; want chains a and c acknowledged whole", res)
	}
	if res[1].Acked != 0 || res[1].Err == nil || outbox.IsUnavailable(res[1].Err) {
		t.Fatalf("chain b: %+v; want nothing acked and its row error", res[1])
	}
	// An unavailable broker fails every chain of the request at once: no
	// request per chain.
	f2 := &fakeProduce{fail: "10"}
	p2 := newTestPublisher(t, 1<<20, f2)
	res = p2.PublishChains(context.Background(), [][]outbox.Envelope{chain("t", "a", 2, 0), chain("t", "b", 2, 10)})
	if len(f2.reqs) != 1 || res[0].Err == nil || res[1].Err == nil {
		t.Fatalf("unavailable: requests %v, results %+v; want one request, every chain failed", f2.reqs, res)
	}
}

func newTestPublisher(t *testing.T, batchBytes int, f *fakeProduce) *Publisher {
	p, err := New(Config{Brokers: []string{"unused:9092"}, BatchBytes: batchBytes})
	if err != nil {
		t.Fatal(err)
	}
	p.parts["t"] = topicParts{ids: []int{0}, fetched: time.Now().Add(time.Hour)}
	p.send = f.produce
	return p
}

func TestPublishChainsOneRequestPerPartition(t *testing.T) {
	f := &fakeProduce{}
	p := newTestPublisher(t, 1<<20, f)
	res := p.PublishChains(context.Background(), [][]outbox.Envelope{chain("t", "a", 3, 0), chain("t", "b", 2, 10), chain("t", "", 1, 20)})
	if len(f.reqs) != 1 || f.reqs[0] != "t/0:0,1,2,10,11,20" {
		t.Fatalf("requests %v, want one with every record in chain order", f.reqs)
	}
	for i, want := range []int{3, 2, 1} {
		if res[i].Acked != want || res[i].Err != nil {
			t.Fatalf("chain %d: %+v", i, res[i])
		}
	}
}

func TestPublishChainsSplitRequestsKeepPrefixes(t *testing.T) {
	// A record here is 42 or 43 bytes (40 + 1-byte key + value): with
	// BatchBytes 100, two records per request.
	f := &fakeProduce{fail: "30"}
	p := newTestPublisher(t, 1024, f)
	p.cfg.BatchBytes = 100
	res := p.PublishChains(context.Background(), [][]outbox.Envelope{chain("t", "a", 3, 0), chain("t", "b", 3, 30)})
	// Requests: [0,1] ok, [2,30] fails (a's 2 and b's 30), [31,32] b is
	// stopped: not sent.
	if strings.Join(f.reqs, " ") != "t/0:0,1 t/0:2,30" {
		t.Fatalf("requests %v", f.reqs)
	}
	if res[0].Acked != 2 || res[0].Err == nil || res[1].Acked != 0 || res[1].Err == nil {
		t.Fatalf("results %+v", res)
	}
}

func TestPublishChainsTooLargeAndMissingTopic(t *testing.T) {
	f := &fakeProduce{}
	p := newTestPublisher(t, 1024, f)
	big := outbox.Envelope{Topic: "t", Key: []byte("a"), Payload: make([]byte, 2000)}
	res := p.PublishChains(context.Background(), [][]outbox.Envelope{
		append(chain("t", "a", 1, 0), big, chain("t", "a", 1, 2)[0]),
	})
	if res[0].Acked != 1 || !errors.Is(res[0].Err, ErrTooLarge) {
		t.Fatalf("result %+v, want the first row acked and ErrTooLarge", res[0])
	}
	if len(f.reqs) != 1 {
		t.Fatalf("requests %v: the row after the oversized one must not be sent", f.reqs)
	}
	pe := p.Publish(context.Background(), []outbox.Envelope{chain("t", "x", 1, 0)[0], big})
	var errs outbox.PublishErrors
	if !errors.As(pe, &errs) || errs[0] != nil || !errors.Is(errs[1], ErrTooLarge) {
		t.Fatalf("Publish = %v", pe)
	}
}

func TestSplitRequests(t *testing.T) {
	mk := func(sizes ...int) []pos {
		var out []pos
		for i, n := range sizes {
			q := pos{idx: i}
			q.msg.Value = make([]byte, n-40)
			out = append(out, q)
		}
		return out
	}
	got := splitRequests(mk(50, 50, 50, 200, 50), 120)
	var shape []int
	for _, r := range got {
		shape = append(shape, len(r))
	}
	if fmt.Sprint(shape) != "[2 1 1 1]" {
		t.Fatalf("split shape %v", shape)
	}
}
