package publishertest_test

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"sync"
	"testing"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/publishertest"
)

// memTopic is an in-memory topic of two lanes, written by memPublisher. It
// stands in for a broker only here, to check the suite's own logic; the
// publishers idemq ships run the suite on real brokers (integration module).
type memTopic struct {
	mu    sync.Mutex
	lanes [2][]publishertest.Message
	next  int // round-robin lane for keyless envelopes
}

// memPublisher refuses payloads above maxPayload.
type memPublisher struct{ topic *memTopic }

const maxPayload = 1024

var errTooLarge = errors.New("payload too large")

func (p memPublisher) store(e outbox.Envelope) error {
	if len(e.Payload) > maxPayload {
		return errTooLarge
	}
	t := p.topic
	t.mu.Lock()
	defer t.mu.Unlock()
	lane := t.next % 2
	if len(e.Key) > 0 {
		h := fnv.New32a()
		_, _ = h.Write(e.Key)
		lane = int(h.Sum32() % 2)
	} else {
		t.next++
	}
	hs := map[string]string{}
	for k, v := range e.Headers {
		hs[k] = v
	}
	t.lanes[lane] = append(t.lanes[lane], publishertest.Message{Lane: strconv.Itoa(lane), Seq: int64(len(t.lanes[lane])),
		Key: append([]byte(nil), e.Key...), Value: append([]byte(nil), e.Payload...), Headers: hs})
	return nil
}

func (p memPublisher) Publish(_ context.Context, batch []outbox.Envelope) error {
	errs := make(outbox.PublishErrors, len(batch))
	failed := false
	for i, e := range batch {
		if errs[i] = p.store(e); errs[i] != nil {
			failed = true
		}
	}
	if failed {
		return errs
	}
	return nil
}

func (p memPublisher) PublishChains(_ context.Context, chains [][]outbox.Envelope) []outbox.ChainResult {
	res := make([]outbox.ChainResult, len(chains))
	for i, c := range chains {
		for _, e := range c {
			if res[i].Err = p.store(e); res[i].Err != nil {
				break
			}
			res[i].Acked++
		}
	}
	return res
}

func (t *memTopic) read(tb testing.TB, n int) []publishertest.Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := append(append([]publishertest.Message(nil), t.lanes[0]...), t.lanes[1]...)
	if len(out) < n {
		tb.Fatalf("%d messages on the topic, want at least %d (memory topics never wait)", len(out), n)
	}
	return out
}

// TestRunInMemory runs the suite against a correct in-memory publisher: the
// suite's own logic passes a publisher that keeps the contract.
func TestRunInMemory(t *testing.T) {
	publishertest.Run(t, func(t *testing.T) publishertest.Harness {
		topic := &memTopic{}
		return publishertest.Harness{
			Publisher: memPublisher{topic},
			Topic:     "mem-" + t.Name(),
			Read:      topic.read,
			Refuse: func(e outbox.Envelope) outbox.Envelope {
				e.Payload = make([]byte, maxPayload+1)
				return e
			},
		}
	})
}
