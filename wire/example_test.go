package wire_test

import (
	"fmt"

	"github.com/idemq/idemq/wire"
)

// A producer of its own stamps the message ID under the name idemq's
// consumers read, and checks that the ID is deduplicated as given.
func Example() {
	headers := map[string]string{wire.MessageIDHeader: "order-42:paid"}
	fmt.Println(wire.MessageIDHeader, wire.CheckMessageID(headers[wire.MessageIDHeader]))
	fmt.Println(wire.CheckMessageID("   "))
	// Output:
	// message-id <nil>
	// idemq/wire: message ID not stored as given: blank (empty or only white space)
}
