package consumer

import "context"

// startMaintenance runs Config.Maintenance (when set) until ctx ends; the
// function returned waits for it to return.
func (c *Consumer) startMaintenance(ctx context.Context) (wait func()) {
	if c.cfg.Maintenance == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.cfg.Maintenance(ctx); err != nil && ctx.Err() == nil {
			c.log.ErrorContext(ctx, "idemq: maintenance stopped", "err", err)
		}
	}()
	return func() { <-done }
}
