package sourcetest_test

import (
	"context"
	"hash/fnv"
	"io"
	"strconv"
	"sync"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/sourcetest"
	"github.com/idemq/idemq/dedup"
)

// memBroker is an in-memory topic of two lanes (more after grow) and one group's committed
// positions. It stands in for a broker only here, to check the suite's own
// logic; the sources idemq ships run the suite on real brokers (integration
// module).
type memBroker struct {
	mu        sync.Mutex
	lanes     [][]sourcetest.Message // two, more after grow; keys hash to the first two
	committed map[string]int64
	changed   chan struct{} // closed and replaced on every Produce
}

func (b *memBroker) produce(_ testing.TB, msgs []sourcetest.Message) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		h := fnv.New32a()
		_, _ = h.Write(m.Key)
		lane := h.Sum32() % 2
		b.lanes[lane] = append(b.lanes[lane], m)
	}
	close(b.changed)
	b.changed = make(chan struct{})
}

// grow adds two lanes and stores one message on each.
func (b *memBroker) grow(t testing.TB) []sourcetest.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []sourcetest.Message
	for range 2 {
		m := sourcetest.Message{ID: t.Name() + "-added-" + strconv.Itoa(len(b.lanes)), Key: []byte("k"), Value: []byte("{}")}
		b.lanes = append(b.lanes, []sourcetest.Message{m})
		out = append(out, m)
	}
	close(b.changed)
	b.changed = make(chan struct{})
	return out
}

// memSource fetches each lane from the group's committed position and
// commits synchronously, never backwards.
type memSource struct {
	b      *memBroker
	next   map[string]int64
	closed bool
}

func (s *memSource) Fetch(ctx context.Context) (consumer.Delivery, error) {
	for {
		s.b.mu.Lock()
		if s.closed {
			s.b.mu.Unlock()
			return consumer.Delivery{}, io.EOF
		}
		for i, msgs := range s.b.lanes {
			lane := strconv.Itoa(i)
			off, ok := s.next[lane]
			if !ok {
				off = max(s.b.committed[lane], 0)
			}
			if off < int64(len(msgs)) {
				m := msgs[off]
				s.next[lane] = off + 1
				s.b.mu.Unlock()
				pos := "mem:" + lane + "/" + strconv.FormatInt(off, 10)
				return consumer.Delivery{Message: &dedup.Message{Key: m.Key, Payload: m.Value, Source: pos, Offset: off},
					MessageID: m.ID, Position: pos, Lane: lane, Offset: off}, nil
			}
		}
		changed := s.b.changed
		s.b.mu.Unlock()
		select {
		case <-ctx.Done():
			return consumer.Delivery{}, ctx.Err()
		case <-changed:
		}
	}
}

func (s *memSource) Commit(_ context.Context, done []consumer.Delivery) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	for _, d := range done {
		if cur, ok := s.b.committed[d.Lane]; !ok || d.Offset+1 > cur {
			s.b.committed[d.Lane] = d.Offset + 1
		}
	}
	return nil
}

func (s *memSource) Close() error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.closed = true
	return nil
}

// TestRunInMemory runs the suite against a correct in-memory source: the
// suite's own logic passes a source that keeps the contract.
func TestRunInMemory(t *testing.T) {
	sourcetest.Run(t, func(*testing.T) sourcetest.Harness {
		b := &memBroker{lanes: make([][]sourcetest.Message, 2), committed: map[string]int64{}, changed: make(chan struct{})}
		return sourcetest.Harness{
			Produce:   b.produce,
			NewSource: func(testing.TB) consumer.Source { return &memSource{b: b, next: map[string]int64{}} },
			Grow:      b.grow,
			Committed: func(testing.TB) map[string]int64 {
				b.mu.Lock()
				defer b.mu.Unlock()
				out := map[string]int64{}
				for k, v := range b.committed {
					out[k] = v
				}
				return out
			},
		}
	})
}

// TestRunInMemoryWithoutCommitted runs the suite with a Harness that cannot
// read committed positions: the cases check them through the next source.
func TestRunInMemoryWithoutCommitted(t *testing.T) {
	sourcetest.Run(t, func(*testing.T) sourcetest.Harness {
		b := &memBroker{lanes: make([][]sourcetest.Message, 2), committed: map[string]int64{}, changed: make(chan struct{})}
		return sourcetest.Harness{
			Produce:   b.produce,
			NewSource: func(testing.TB) consumer.Source { return &memSource{b: b, next: map[string]int64{}} },
			Grow:      b.grow,
		}
	})
}
