package redisfast

import (
	"testing"

	"github.com/idemq/idemq/promx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Two fast paths' collectors share a registry when each has its own const
// labels; the same labels twice still fail. Registration never dials.
func TestCollectorRegistersTwiceWithConstLabels(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for _, name := range []string{"a", "b"} {
		client := redis.NewClient(ClientOptions("redis.invalid:6379"))
		t.Cleanup(func() { _ = client.Close() })
		f, err := New(Config{Client: client})
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Register(f.Collector(promx.ConstLabels(prometheus.Labels{"fastpath": name}))); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if name == "b" {
			if err := reg.Register(f.Collector(promx.ConstLabels(prometheus.Labels{"fastpath": name}))); err == nil {
				t.Fatal("the same const labels twice registered")
			}
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "idemq_fastpath_breaker_state" && len(mf.GetMetric()) != 2 {
			t.Fatalf("breaker state series = %d, want 2", len(mf.GetMetric()))
		}
	}
}
