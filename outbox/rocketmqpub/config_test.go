package rocketmqpub

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// Every Config error wraps ErrInvalidConfig and names the field; New returns
// it before it starts a client, so no NameServer is needed.
func TestConfigErrors(t *testing.T) {
	ns := []string{"127.0.0.1:1"}
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{}, "NameServers"},
		{Config{NameServers: []string{""}}, "NameServers[0]"},
		// -1 used to mean "no retries": refused now, with a pointer to the
		// explicit field.
		{Config{NameServers: ns, Retries: -1}, "DisableRetries"},
		{Config{NameServers: ns, Retries: 3, DisableRetries: true}, "DisableRetries"},
		{Config{NameServers: ns, SendTimeout: -time.Second}, "SendTimeout"},
		{Config{NameServers: ns, Concurrency: 257}, "Concurrency"},
		{Config{NameServers: ns, Credentials: primitive.Credentials{AccessKey: "ak"}}, "Credentials.SecretKey"},
		{Config{NameServers: ns, Credentials: primitive.Credentials{SecretKey: "s3cret"}}, "Credentials.AccessKey"},
	} {
		_, err := New(tc.cfg)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig naming %s", tc.cfg, err, tc.field)
		}
	}
}
