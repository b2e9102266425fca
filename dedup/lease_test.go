package dedup

import (
	"errors"
	"testing"
	"time"
)

// A lease TTL must fit under the broker's redelivery timer and be at least
// 1 s; the error wraps ErrInvalidConfig.
func TestLeaseOptionsValidateUnder(t *testing.T) {
	for _, c := range []struct {
		opt   LeaseOptions
		timer time.Duration
		ok    bool
	}{
		{LeaseOptions{TTL: 20 * time.Minute}, 15 * time.Minute, false}, // above RocketMQ's ConsumeTimeout
		{LeaseOptions{TTL: 15 * time.Minute}, 15 * time.Minute, false},
		{LeaseOptions{TTL: 500 * time.Millisecond}, 0, false},
		{LeaseOptions{}, 45 * time.Second, true},  // default 30 s
		{LeaseOptions{TTL: time.Minute}, 0, true}, // no broker timer
	} {
		err := c.opt.ValidateUnder(c.timer)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v.ValidateUnder(%s) = %v; want ok %v", c.opt, c.timer, err, c.ok)
		}
	}
}
