package rocketmqadapter

import (
	"errors"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
)

// S20 on RocketMQ: a blank message-id property is absent; the UNIQ_KEY
// applies, then MsgId, then the position. Never a " " shared by many.
func TestMessageIDBlankFallsBack(t *testing.T) {
	for _, blank := range []string{"", " ", "\t", " \t\r\n", "\u00a0", "\u3000"} {
		if got := MessageID(ext("orders", "U1", "O1", map[string]string{wire.MessageIDHeader: blank}), ""); got != "U1" {
			t.Errorf("message-id %q: MessageID = %q, want the UNIQ_KEY U1", blank, got)
		}
		m := ext("orders", "", "O2", map[string]string{wire.MessageIDHeader: blank, primitive.PropertyUniqueClientMessageIdKeyIndex: blank})
		m.MsgId = "U2"
		if got := MessageID(m, ""); got != "U2" {
			t.Errorf("message-id and UNIQ_KEY %q: MessageID = %q, want MsgId U2", blank, got)
		}
		m.MsgId = blank
		if got := MessageID(m, ""); got != "" {
			t.Errorf("everything %q: MessageID = %q, want \"\" (the position)", blank, got)
		}
	}
	// Two messages with a blank message-id and no UNIQ_KEY get their own
	// positions, not one shared identity.
	a, b := ext("orders", "", "O3", map[string]string{wire.MessageIDHeader: " "}), ext("orders", "", "O4", map[string]string{wire.MessageIDHeader: " "})
	a.Queue, b.Queue = &primitive.MessageQueue{Topic: "orders", BrokerName: "broker-a"}, &primitive.MessageQueue{Topic: "orders", BrokerName: "broker-a"}
	a.QueueOffset, b.QueueOffset = 5, 6
	da, db := ToDelivery(a, ""), ToDelivery(b, "")
	ia, _ := dedup.NewIdentity("s", da.MessageID, da.Position, "")
	ib, _ := dedup.NewIdentity("s", db.MessageID, db.Position, "")
	if ia.MessageID != "rocketmq:orders/broker-a/0/5" || ib.MessageID != "rocketmq:orders/broker-a/0/6" {
		t.Fatalf("identities %q and %q, want the two positions", ia.MessageID, ib.MessageID)
	}
	// A message ID that is not blank is kept as is, spaces included.
	if got := MessageID(ext("orders", "U1", "O1", map[string]string{wire.MessageIDHeader: " m-1 "}), ""); got != " m-1 " {
		t.Errorf("non-blank message-id: %q", got)
	}
}

func TestBusinessKeyFromPropertyBlank(t *testing.T) {
	msg := &dedup.Message{Headers: map[string]string{"order-id": " \t"}}
	if k, err := BusinessKeyFromProperty("order-id", false)(msg); k != "" || err != nil {
		t.Fatalf("blank, optional: %q %v, want no key", k, err)
	}
	if _, err := BusinessKeyFromProperty("order-id", true)(msg); !errors.Is(err, ErrNoBusinessKey) {
		t.Fatalf("blank, required: err = %v, want ErrNoBusinessKey", err)
	}
	if k, _ := BusinessKeyFromKeys(&dedup.Message{Key: []byte("  ")}); k != "" {
		t.Fatalf("blank keys: %q", k)
	}
}
