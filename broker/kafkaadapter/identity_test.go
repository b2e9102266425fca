package kafkaadapter

import (
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
	"github.com/segmentio/kafka-go"
)

// S20: a blank message-id header is absent: each message gets its own
// position identity, never a shared "" or " ".
func TestToDeliveryBlankHeaderFallsBackToPosition(t *testing.T) {
	seen := map[string]bool{}
	for i, blank := range []string{"", " ", "\t", " ", "\u00a0\u2003"} {
		off := int64(5 + i)
		m := kafka.Message{Topic: "orders", Partition: 0, Offset: off, Value: []byte(`{}`),
			Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte(blank)}}}
		d := ToDelivery(m, "")
		if d.MessageID != "" {
			t.Fatalf("header %q: MessageID = %q, want absent", blank, d.MessageID)
		}
		id, err := dedup.NewIdentity("orders-svc", d.MessageID, d.Position, "")
		if err != nil || id.MessageID != Position("orders", 0, off) || seen[id.MessageID] {
			t.Fatalf("header %q at offset %d: identity %q, %v", blank, off, id.MessageID, err)
		}
		seen[id.MessageID] = true
	}
	if d := ToDelivery(kafka.Message{Topic: "orders", Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte(" m-1")}}}, ""); d.MessageID != " m-1" {
		t.Fatalf("a header that is not blank is kept as is: %q", d.MessageID)
	}
}
