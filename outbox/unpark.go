package outbox

import (
	"context"
	"fmt"
)

// ParkedFilter selects parked rows for UnparkMatching and CountParked. The
// zero value selects every parked row.
type ParkedFilter struct {
	// Topic is the exact topic; "" matches every topic.
	Topic string
	// Key is the exact key; nil or empty matches every key. A row stored
	// without a key is matched only when Key is empty.
	Key []byte
}

func (f ParkedFilter) args() []any {
	var topic, key any
	if f.Topic != "" {
		topic = f.Topic
	}
	if len(f.Key) > 0 {
		key = f.Key
	}
	return []any{topic, key}
}

// UnparkMatching makes every parked row that f selects publishable again
// now, as Unpark does for IDs (attempts reset to 0, the last error kept),
// in one statement, and wakes the relays. It returns how many rows it
// changed. Errors: ErrNoPool, or the database's.
func (o *Outbox) UnparkMatching(ctx context.Context, f ParkedFilter) (int64, error) {
	if o.pool == nil {
		return 0, ErrNoPool
	}
	tag, err := o.pool.Exec(ctx, o.q.unparkMatchingSQL, f.args()...)
	if err != nil {
		return 0, fmt.Errorf("idemq/outbox: unpark: %w", err)
	}
	if tag.RowsAffected() > 0 {
		_, _ = o.pool.Exec(ctx, o.q.notifySQL, o.q.channel)
	}
	return tag.RowsAffected(), nil
}

// CountParked counts the parked rows f selects: what UnparkMatching would
// change now (`idemq outbox unpark --dry-run`). Errors: ErrNoPool, or the
// database's.
func (o *Outbox) CountParked(ctx context.Context, f ParkedFilter) (int64, error) {
	if o.pool == nil {
		return 0, ErrNoPool
	}
	var n int64
	if err := o.pool.QueryRow(ctx, o.q.countParkedMatchingSQL, f.args()...).Scan(&n); err != nil {
		return 0, fmt.Errorf("idemq/outbox: count parked: %w", err)
	}
	return n, nil
}
