package dedup

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestLeaseOptionsDisableHeartbeat(t *testing.T) {
	o := LeaseOptions{TTL: 9 * time.Second}.WithDefaults()
	if o.Heartbeat != 3*time.Second {
		t.Fatalf("default Heartbeat %s, want TTL/3", o.Heartbeat)
	}
	o = LeaseOptions{TTL: 9 * time.Second, DisableHeartbeat: true}.WithDefaults()
	if o.Heartbeat != 0 || o.ValidateUnder(0) != nil {
		t.Fatalf("DisableHeartbeat: Heartbeat %s (want 0: no heartbeat), validate %v", o.Heartbeat, o.ValidateUnder(0))
	}
	for _, tc := range []struct {
		o    LeaseOptions
		want string
	}{
		// The old sentinel is refused, naming the field and what to set instead.
		{LeaseOptions{Heartbeat: -1}, "set DisableHeartbeat"},
		{LeaseOptions{Heartbeat: time.Second, DisableHeartbeat: true}, "Heartbeat must be zero"},
	} {
		err := tc.o.WithDefaults().ValidateUnder(0)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrInvalidConfig saying %q", tc.o, err, tc.want)
		}
	}
}
