package consumer_test

import (
	"errors"
	"fmt"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
)

// Configuration is validated at construction; errors name the field.
func ExampleNew() {
	_, err := consumer.New(consumer.Config{Scope: "payments"})
	fmt.Println(errors.Is(err, consumer.ErrInvalidConfig))
	fmt.Println(err)
	// Output:
	// true
	// idemq/consumer: invalid config: Store is required
}

// Counters is the in-memory Metrics for tests, demos and status pages:
// outcomes, and duplicates by the key they matched.
func ExampleCounters() {
	var c consumer.Counters
	c.Delivery("payments", dedup.OutcomeProcessed, "")
	c.Delivery("payments", dedup.OutcomeDuplicate, dedup.ByMessageID)
	c.Delivery("payments", dedup.OutcomeDuplicate, dedup.ByBusinessKey)
	fmt.Println(c.Get("processed"), c.Get("duplicate"), c.Get("duplicate:business_key"))
	// Output: 1 2 1
}
