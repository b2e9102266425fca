package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
)

// A user middleware sees every delivery of both drive modes, with its
// identity filled in, and the recorded outcome on the way back. It runs
// inside the built-in tracing, recover, logging and metrics middleware and
// outside the timeout (see the package documentation, "Middleware").
func ExampleMiddleware() {
	audit := func(next consumer.ProcessFunc) consumer.ProcessFunc {
		return func(ctx context.Context, d *consumer.Delivery) (dedup.Result, error) {
			res, err := next(ctx, d)
			fmt.Printf("audit: %s %s -> %s\n", d.Message.Topic, d.Message.Identity.MessageID, res.Outcome)
			return res, err
		}
	}
	c, err := consumer.New(consumer.Config{
		Scope:        "mailer",
		Store:        newLeaseOnlyStore(), // Redis or Postgres in production
		LeaseHandler: func(context.Context, *dedup.Message) error { return nil },
		Middleware:   []consumer.Middleware{audit},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	d := consumer.Delivery{Message: &dedup.Message{Topic: "emails", Payload: []byte("hi")},
		MessageID: "m-1", Position: "demo:emails/0/7"}
	for range 2 { // the second copy is a duplicate
		if _, err := c.Handle(context.Background(), d); err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// audit: emails m-1 -> processed
	// audit: emails m-1 -> duplicate
}

// leaseOnlyStore is a consumer.Store that keeps records in a map: enough for
// an example, none of a real store's guarantees.
type leaseOnlyStore struct {
	mu   sync.Mutex
	done map[string]bool
}

func newLeaseOnlyStore() *leaseOnlyStore { return &leaseOnlyStore{done: map[string]bool{}} }

func (s *leaseOnlyStore) ProcessLeased(ctx context.Context, msg *dedup.Message, h dedup.LeaseHandler, _ dedup.LeaseOptions) (dedup.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done[msg.Identity.MessageID] {
		return dedup.Result{Outcome: dedup.OutcomeDuplicate, MatchedBy: dedup.ByMessageID}, nil
	}
	if err := h(ctx, msg); err != nil {
		return dedup.Result{Outcome: dedup.OutcomeRetry, Err: err, HandlerCalled: true}, nil
	}
	s.done[msg.Identity.MessageID] = true
	return dedup.Result{Outcome: dedup.OutcomeProcessed, HandlerCalled: true}, nil
}

func (s *leaseOnlyStore) Reject(context.Context, *dedup.Message, string, error) (dedup.Result, error) {
	return dedup.Result{Outcome: dedup.OutcomeDeadLetter}, nil
}
func (s *leaseOnlyStore) ValidateRetention(time.Duration) error { return nil }
func (s *leaseOnlyStore) MaxAttempts() int                      { return 5 }
func (s *leaseOnlyStore) SucceededRetention() time.Duration     { return 24 * time.Hour }
