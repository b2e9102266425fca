package consumer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// horizonSource is an errSource that reports a redelivery horizon.
type horizonSource struct {
	errSource
	horizon time.Duration
}

func (h *horizonSource) RedeliveryHorizon(context.Context) (time.Duration, error) {
	return h.horizon, nil
}

// An unbounded horizon (0) is refused at start unless the config accepts
// it; accepted, Run starts (and here returns the first Fetch error).
func TestRunRefusesUnboundedHorizon(t *testing.T) {
	base := Config{Scope: "s", Store: newFakeStore(&trail{}), Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }}
	c, err := New(base)
	if err != nil {
		t.Fatal(err)
	}
	src := &horizonSource{}
	err = c.Run(context.Background(), src)
	if !errors.Is(err, ErrUnboundedRedelivery) || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "AcceptUnboundedRedelivery") || !src.closed {
		t.Fatalf("Run = %v (closed %v); want ErrUnboundedRedelivery naming AcceptUnboundedRedelivery, source closed", err, src.closed)
	}
	base.AcceptUnboundedRedelivery = true
	c, err = New(base)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(context.Background(), &horizonSource{})
	if err == nil || !strings.Contains(err.Error(), "broker gone") {
		t.Fatalf("Run = %v; want it to start and return the fetch error", err)
	}
	// A bounded horizon under the retention starts without the field.
	base.AcceptUnboundedRedelivery = false
	c, _ = New(base)
	if err := c.Run(context.Background(), &horizonSource{horizon: time.Hour}); err == nil || !strings.Contains(err.Error(), "broker gone") {
		t.Fatalf("Run = %v; want it to start", err)
	}
}
