package memstore_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/memstore"
)

// A handler's unit test: the same message delivered twice is applied once,
// and a failing run leaves no write behind.
func Example() {
	st, err := memstore.New(memstore.Config{MaxAttempts: 3})
	if err != nil {
		panic(err)
	}
	// The handler under test: credits an account in the store's transaction.
	credit := func(_ context.Context, tx *memstore.Tx, m *dedup.Message) error {
		if string(m.Payload) == "bad" {
			return errors.New("provider down")
		}
		tx.Set("credited/"+m.Identity.MessageID, m.Payload)
		return nil
	}
	deliver := func(id, payload string) {
		ident, err := dedup.NewIdentity("billing", id, "", "")
		if err != nil {
			panic(err)
		}
		res, err := st.Process(context.Background(), &dedup.Message{Identity: ident, Payload: []byte(payload)}, credit)
		fmt.Println(id, res.Outcome, res.Attempts, err)
	}
	deliver("m-1", "40")
	deliver("m-1", "40") // a redelivery
	deliver("m-2", "bad")
	fmt.Println(st.Keys())
	// Output:
	// m-1 processed 1 <nil>
	// m-1 duplicate 1 <nil>
	// m-2 retry 1 <nil>
	// [credited/m-1]
}
