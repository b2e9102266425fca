package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// RetryPolicy is an in-place retry schedule of the store for one class of
// failure (Config.TransientRetry, Config.OutcomeUnknownRetry): after the
// first try, up to Attempts retries, the first after about Initial, each
// later delay doubling up to Max, every delay jittered by ±50%
// (cenkalti/backoff's ExponentialBackOff). A retry is never counted as an
// attempt of the record. The zero value of each field means the default of
// the Config field that holds the policy; Disable turns the retries off.
type RetryPolicy struct {
	// Disable turns the policy off: one try, no retry. Default false. The
	// other fields must then be zero.
	Disable bool
	// Attempts is how many retries follow the first try. 0 means the
	// default; 1 to 100 otherwise. Negative values are refused (New
	// returns an error wrapping ErrInvalidConfig): set Disable for no
	// retry.
	Attempts int
	// Initial is the delay before the first retry (before jitter). 0 means
	// the default; at most 1 minute.
	Initial time.Duration
	// Max caps the delay between retries (before jitter). 0 means the
	// default; at least Initial, at most 1 minute.
	Max time.Duration
}

var (
	defaultTransientRetry      = RetryPolicy{Attempts: 3, Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	defaultOutcomeUnknownRetry = RetryPolicy{Attempts: 3, Initial: 100 * time.Millisecond, Max: time.Second}
)

// maxRetryDelay bounds RetryPolicy.Initial and Max: the store retries in
// place, while the delivery waits.
const maxRetryDelay = time.Minute

func (p RetryPolicy) withDefaults(def RetryPolicy) RetryPolicy {
	if p.Disable {
		return p
	}
	if p.Attempts == 0 {
		p.Attempts = def.Attempts
	}
	if p.Initial == 0 {
		p.Initial = def.Initial
	}
	if p.Max == 0 {
		p.Max = max(def.Max, p.Initial)
	}
	return p
}

func (p RetryPolicy) validate(field string) error {
	switch {
	case p.Disable && (p.Attempts != 0 || p.Initial != 0 || p.Max != 0):
		return fmt.Errorf("%w: %s.Disable is set: Attempts, Initial and Max must be zero (they are %d, %s, %s)", dedup.ErrInvalidConfig, field, p.Attempts, p.Initial, p.Max)
	case p.Disable:
		return nil
	case p.Attempts < 0:
		return fmt.Errorf("%w: %s.Attempts %d is negative: a negative value no longer means no retry; set %s.Disable instead", dedup.ErrInvalidConfig, field, p.Attempts, field)
	case p.Attempts > 100:
		return fmt.Errorf("%w: %s.Attempts %d must be at most 100", dedup.ErrInvalidConfig, field, p.Attempts)
	case p.Initial < 0 || p.Initial > maxRetryDelay:
		return fmt.Errorf("%w: %s.Initial %s must be 0 to %s", dedup.ErrInvalidConfig, field, p.Initial, maxRetryDelay)
	case p.Max < p.Initial || p.Max > maxRetryDelay:
		return fmt.Errorf("%w: %s.Max %s must be at least Initial %s and at most %s", dedup.ErrInvalidConfig, field, p.Max, p.Initial, maxRetryDelay)
	}
	return nil
}

// tries is the number of tries the policy allows: 1 + its retries (1 when
// disabled).
func (p RetryPolicy) tries() uint {
	if p.Disable {
		return 1
	}
	return uint(1 + max(p.Attempts, 0))
}

// retryWhile runs op until it returns an error for which retry is false (nil
// included), at most p.tries() times, waiting p's backoff in between. It
// returns op's last result and error; when ctx ends before a retry, op's
// last error joined with ctx's cause (the last result is still returned).
func retryWhile[T any](ctx context.Context, p RetryPolicy, log *slog.Logger, what string, retry func(error) bool, op func() (T, error)) (T, error) {
	b := &backoff.ExponentialBackOff{InitialInterval: p.Initial, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: p.Max}
	var last error
	res, err := backoff.Retry(ctx, func() (T, error) {
		res, err := op()
		last = err
		if err != nil && !retry(err) {
			return res, backoff.Permanent(err)
		}
		return res, err
	}, backoff.WithBackOff(b), backoff.WithMaxTries(p.tries()), backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, d time.Duration) {
			log.DebugContext(ctx, "idemq: retrying in place", "what", what, "class", dedup.Classify(err), "after", d, "err", err)
		}))
	if err != nil && last != nil && !errors.Is(last, err) {
		// backoff answers with ctx's cause alone when ctx ended between
		// tries: keep what the last try said.
		err = errors.Join(last, err)
	}
	return res, err
}

// validateTxOptions refuses handler transaction options the store cannot
// run under (see Config.TxOptions).
func validateTxOptions(o pgx.TxOptions) error {
	switch {
	case o.IsoLevel != pgx.ReadCommitted && o.IsoLevel != pgx.RepeatableRead && o.IsoLevel != pgx.Serializable:
		return fmt.Errorf("%w: TxOptions.IsoLevel %q must be %q (the default), %q or %q", dedup.ErrInvalidConfig, o.IsoLevel, pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable)
	case o.AccessMode != "" && o.AccessMode != pgx.ReadWrite:
		return fmt.Errorf("%w: TxOptions.AccessMode %q: the handler's transaction writes the consumption record, it must be %q", dedup.ErrInvalidConfig, o.AccessMode, pgx.ReadWrite)
	case o.DeferrableMode != "" && o.DeferrableMode != pgx.NotDeferrable:
		return fmt.Errorf("%w: TxOptions.DeferrableMode %q: deferrable applies to read-only serializable transactions only, it must be empty or %q", dedup.ErrInvalidConfig, o.DeferrableMode, pgx.NotDeferrable)
	case o.BeginQuery != "" || o.CommitQuery != "":
		return fmt.Errorf("%w: TxOptions.BeginQuery and CommitQuery must be empty (IsoLevel sets the isolation)", dedup.ErrInvalidConfig)
	}
	return nil
}
