package kafkaadapter

import (
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestToDelivery(t *testing.T) {
	m := kafka.Message{Topic: "payments", Partition: 2, Offset: 1041, Key: []byte("acct-7"), Value: []byte(`{}`),
		Headers: []kafka.Header{{Key: "message-id", Value: []byte("old")}, {Key: "message-id", Value: []byte("m-1")}, {Key: "trace", Value: []byte("t")}}}
	d := ToDelivery(m, "")
	if d.MessageID != "m-1" || d.Position != "kafka:payments/2/1041" || d.Lane != "payments/2" || d.Offset != 1041 {
		t.Fatalf("delivery = %+v", d)
	}
	if d.Message.Headers["trace"] != "t" || string(d.Message.Key) != "acct-7" || d.Message.Source != d.Position {
		t.Fatalf("message = %+v", d.Message)
	}
	if _, ok := d.Ack.(kafka.Message); !ok {
		t.Fatal("Ack must carry the kafka.Message for CommitMessages")
	}
	if d := ToDelivery(kafka.Message{Topic: "t"}, "x-id"); d.MessageID != "" || d.Position != "kafka:t/0/0" {
		t.Fatalf("missing header: %+v", d)
	}
}

func TestNewSourceValidates(t *testing.T) {
	base := kafka.ReaderConfig{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topic: "t"}
	bad := []kafka.ReaderConfig{
		{GroupID: "g", Topic: "t"},
		{Brokers: base.Brokers, Topic: "t"},
		{Brokers: base.Brokers, GroupID: "g"},
		{Brokers: base.Brokers, GroupID: "g", Topic: "t", CommitInterval: time.Second},
	}
	for i, rc := range bad {
		if _, err := NewSource(Config{Reader: rc}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("config %d: err = %v", i, err)
		}
	}
}
