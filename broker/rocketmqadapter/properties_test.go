package rocketmqadapter

import (
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/wire"
)

func TestUserProperties(t *testing.T) {
	props := map[string]string{
		primitive.PropertyUniqueClientMessageIdKeyIndex: "U1", primitive.PropertyKeys: "ord-1",
		primitive.PropertyRetryTopic: "orders", primitive.PropertyMinOffset: "0", primitive.PropertyDelayTimeLevel: "3",
		primitive.PropertyTags: "paid", wire.MessageIDHeader: "m-1", "traceparent": "00-abc-def-01", "tenant": "t-9",
	}
	got := UserProperties(props)
	want := map[string]string{primitive.PropertyTags: "paid", wire.MessageIDHeader: "m-1", "traceparent": "00-abc-def-01", "tenant": "t-9"}
	if len(got) != len(want) {
		t.Fatalf("UserProperties = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("UserProperties = %v, want %v", got, want)
		}
	}
	if props[primitive.PropertyUniqueClientMessageIdKeyIndex] != "U1" {
		t.Fatal("UserProperties changed its input")
	}
	if UserProperties(nil) != nil {
		t.Fatal("nil in, nil out")
	}
}
