package outbox

import (
	"context"
	"errors"
	"fmt"
)

// ErrRelayNotRunning is returned by Ready when Run is not running (not
// started yet, still running its start checks, or returned).
var ErrRelayNotRunning = errors.New("idemq/outbox: relay not running")

// Ready reports whether the relay can work now, for a readiness probe
// (`idemq relay --metrics-addr` serves it as /readyz): nil while Run is
// running past its start checks (the schema check and the table probe) and
// the outbox table answers a probe query (bounded by ctx).
// Errors: ErrRelayNotRunning, or the probe's error naming the table. A
// broker outage does not make the relay unready (publishing pauses and
// resumes by itself, see RelayStats.BreakerOpen).
func (r *Relay) Ready(ctx context.Context) error {
	if !r.serving.Load() {
		return ErrRelayNotRunning
	}
	if _, err := r.ob.pool.Exec(ctx, r.ob.q.probeSQL); err != nil {
		return fmt.Errorf("idemq/outbox: relay: outbox table %s: %w", r.ob.q.table, err)
	}
	return nil
}
