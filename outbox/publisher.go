package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Publisher sends envelopes to a broker. The relay calls Publish with rows
// that all have distinct keys (or no key), so an implementation may send them
// in any order and in parallel; the relay itself keeps each key's order by
// publishing a key's next row only after the previous one succeeded.
// outbox/kafkapub and outbox/rocketmqpub are the provided implementations.
//
// Publish returns only once every envelope is either acknowledged by the
// broker (durably: Kafka acks=all, RocketMQ SEND_OK) or known to have failed,
// or ctx ends. It returns nil when all were acknowledged, PublishErrors (one
// entry per envelope, nil for the acknowledged ones) when some failed, and
// any other error to mean that none can be assumed acknowledged. A failure
// may still have reached the broker (a lost acknowledgement): the relay
// publishes the row again later with the same message ID, and the consumer's
// dedup absorbs the copy.
//
// Publish is never called concurrently on one Publisher by one relay worker,
// but several workers and relays may share a Publisher, so it must be safe
// for concurrent use.
type Publisher interface {
	// Publish sends batch and returns nil only when the broker acknowledged
	// every envelope (see above for partial failures).
	Publish(ctx context.Context, batch []Envelope) error
}

// ChainPublisher is a Publisher that can also publish several rows per key in
// one call. The relay uses PublishChains when its Publisher has it, and
// rounds of Publish (at most one row per key per call, a key's next row only
// after the previous one was acknowledged) otherwise. Both publishers
// provided implement it: kafkapub with one atomic record batch per
// partition, rocketmqpub by sending each chain's rows in order and stopping
// at the first failure.
type ChainPublisher interface {
	Publisher
	// PublishChains publishes chains: each chain holds the rows of one key
	// in order (or a single keyless row), and no two chains share a key. It
	// returns one ChainResult per chain, in order. An implementation must
	// never let a chain's envelope be stored unless every earlier envelope
	// of the chain was stored too (send in order and stop at the first
	// failure, or append a chain atomically): the stored part of a chain
	// is always a prefix, so a consumer sees the first copy of every row in
	// order however often the relay retries. It returns once every chain is
	// settled or ctx ends.
	PublishChains(ctx context.Context, chains [][]Envelope) []ChainResult
}

// ChainResult is the outcome of one chain of PublishChains.
type ChainResult struct {
	// Acked is how many leading envelopes of the chain the broker
	// acknowledged (0 to the chain's length).
	Acked int
	// Err is why envelope Acked was not acknowledged, when Acked is less
	// than the chain's length; nil otherwise. The relay retries that row
	// (and holds back the rest of the chain) with backoff.
	Err error
}

// PublisherFunc adapts a function to Publisher, e.g. to wrap one for fault
// injection or metrics.
type PublisherFunc func(ctx context.Context, batch []Envelope) error

// Publish implements Publisher.
func (f PublisherFunc) Publish(ctx context.Context, batch []Envelope) error { return f(ctx, batch) }

// PublishErrors reports per-envelope outcomes of a partly failed Publish:
// entry i is the error of envelope i, nil if it was acknowledged. Its length
// must equal the batch's.
type PublishErrors []error

// Error summarizes the failures: how many, and the first one.
func (e PublishErrors) Error() string {
	n, first := 0, error(nil)
	for _, err := range e {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	if first == nil {
		return "idemq/outbox: publish: no errors"
	}
	return fmt.Sprintf("idemq/outbox: publish: %d of %d failed; first: %v", n, len(e), first)
}

// Unwrap returns the non-nil errors, so errors.Is and errors.As see them.
func (e PublishErrors) Unwrap() []error {
	var out []error
	for _, err := range e {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// perEnvelope expands the result of Publish into one error per envelope. A
// panic in the publisher is turned into an error for the whole batch.
func perEnvelope(ctx context.Context, pub Publisher, batch []Envelope) (errs []error) {
	errs = make([]error, len(batch))
	defer func() {
		if v := recover(); v != nil {
			err := fmt.Errorf("idemq/outbox: publisher panic: %v", v)
			for i := range errs {
				errs[i] = err
			}
		}
	}()
	err := pub.Publish(ctx, batch)
	if err == nil {
		return errs
	}
	var pe PublishErrors
	if errors.As(err, &pe) && len(pe) == len(batch) {
		copy(errs, pe)
		return errs
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// perChain calls PublishChains, turning a panic or a malformed result into a
// failure of every chain.
func perChain(ctx context.Context, cp ChainPublisher, chains [][]Envelope) (res []ChainResult) {
	fail := func(err error) []ChainResult {
		out := make([]ChainResult, len(chains))
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	defer func() {
		if v := recover(); v != nil {
			res = fail(fmt.Errorf("idemq/outbox: publisher panic: %v", v))
		}
	}()
	res = cp.PublishChains(ctx, chains)
	if len(res) != len(chains) {
		return fail(fmt.Errorf("idemq/outbox: publisher returned %d results for %d chains", len(res), len(chains)))
	}
	return res
}

// errorText renders a publish error for the last_error column.
func errorText(err error, maxBytes int) string {
	s := err.Error()
	s = strings.TrimSpace(s)
	return clip(s, maxBytes)
}
