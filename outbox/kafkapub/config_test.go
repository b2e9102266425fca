package kafkapub

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Every Config error wraps ErrInvalidConfig and names the field.
func TestConfigErrors(t *testing.T) {
	b := []string{"127.0.0.1:1"}
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{}, "Brokers"},
		{Config{Brokers: b, BatchBytes: 100}, "BatchBytes"},
		{Config{Brokers: b, WriteTimeout: -time.Second}, "WriteTimeout"},
		{Config{Brokers: b, MetadataTTL: -time.Second}, "MetadataTTL"},
		{Config{Brokers: b, TopicPartitions: -1}, "TopicPartitions"},
	} {
		_, err := New(tc.cfg)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig naming %s", tc.cfg, err, tc.field)
		}
	}
}
