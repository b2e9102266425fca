package dedup

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"
)

// Config configures a Store. The zero value of every field but Fingerprinter
// means "use the default" given in the field's comment.
type Config struct {
	// Schema holds the tables. Default "idemq". Created by Migrate if absent.
	// A lowercase SQL identifier: [a-z_][a-z0-9_]{0,39}.
	Schema string
	// RecordsTable is the consumption record table. Default
	// "consumption_records". Same identifier rule as Schema.
	RecordsTable string
	// DeadLettersTable is the dead-letter table. Default "dead_letters".
	// Same identifier rule as Schema.
	DeadLettersTable string
	// Fingerprinter fingerprints payloads. Required.
	Fingerprinter *Fingerprinter
	// MaxAttempts is how many handler executions a record may start before a
	// retryable failure becomes FAILED_FINAL. Default 5; must be 1 to 1000.
	MaxAttempts int
	// MaxErrorBytes bounds last_error and dead-letter error text, in bytes.
	// Default 2048; at least 64.
	MaxErrorBytes int
	// SucceededRetention is how long a SUCCEEDED record is kept (expires_at =
	// database now() + this). Default 7 days. It must be at least the broker's
	// redelivery horizon; see ValidateRetention.
	SucceededRetention time.Duration
	// FailedFinalRetention is how long a FAILED_FINAL record is kept.
	// Default 30 days; at least SucceededRetention.
	FailedFinalRetention time.Duration
	// Logger receives debug lines for claims and marks. Default slog.Default().
	Logger *slog.Logger
	// FastPath, when set, answers duplicates of SUCCEEDED records without
	// Postgres (e.g. redisfast.New). Default nil: Postgres only. A FastPath
	// with a TTL() method must not remember longer than SucceededRetention.
	FastPath FastPath
}

var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

// ErrInvalidConfig is wrapped by every configuration error of this package.
var ErrInvalidConfig = errors.New("idemq: invalid config")

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = "idemq"
	}
	if c.RecordsTable == "" {
		c.RecordsTable = "consumption_records"
	}
	if c.DeadLettersTable == "" {
		c.DeadLettersTable = "dead_letters"
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.MaxErrorBytes == 0 {
		c.MaxErrorBytes = 2048
	}
	if c.SucceededRetention == 0 {
		c.SucceededRetention = 7 * 24 * time.Hour
	}
	if c.FailedFinalRetention == 0 {
		c.FailedFinalRetention = 30 * 24 * time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	for name, v := range map[string]string{"Schema": c.Schema, "RecordsTable": c.RecordsTable, "DeadLettersTable": c.DeadLettersTable} {
		if !identRe.MatchString(v) {
			return fmt.Errorf("%w: %s %q must match %s", ErrInvalidConfig, name, v, identRe)
		}
	}
	switch {
	case c.RecordsTable == c.DeadLettersTable:
		return fmt.Errorf("%w: RecordsTable and DeadLettersTable are both %q", ErrInvalidConfig, c.RecordsTable)
	case c.Fingerprinter == nil:
		return fmt.Errorf("%w: Fingerprinter is required (see NewFingerprinter)", ErrInvalidConfig)
	case c.MaxAttempts < 1 || c.MaxAttempts > 1000:
		return fmt.Errorf("%w: MaxAttempts %d must be 1 to 1000", ErrInvalidConfig, c.MaxAttempts)
	case c.MaxErrorBytes < 64:
		return fmt.Errorf("%w: MaxErrorBytes %d must be at least 64", ErrInvalidConfig, c.MaxErrorBytes)
	case c.SucceededRetention < time.Minute:
		return fmt.Errorf("%w: SucceededRetention %s must be at least 1m", ErrInvalidConfig, c.SucceededRetention)
	case c.FailedFinalRetention < c.SucceededRetention:
		return fmt.Errorf("%w: FailedFinalRetention %s is shorter than SucceededRetention %s", ErrInvalidConfig, c.FailedFinalRetention, c.SucceededRetention)
	}
	if t, ok := c.FastPath.(interface{ TTL() time.Duration }); ok && t.TTL() > c.SucceededRetention {
		return fmt.Errorf("%w: FastPath TTL %s is longer than SucceededRetention %s: a purged record would still be answered from the fast path", ErrInvalidConfig, t.TTL(), c.SucceededRetention)
	}
	return nil
}

// ErrRetentionTooShort is returned by ValidateRetention.
var ErrRetentionTooShort = errors.New("idemq: retention shorter than the broker's redelivery horizon")

// ValidateRetention refuses a SucceededRetention shorter than the broker's
// redelivery horizon: a record purged before the broker stops
// redelivering would let a late copy run again. Kafka's horizon is the topic's
// retention.ms; RocketMQ's is the sum of the delay levels up to the max
// reconsume times. The error names both numbers.
func (s *Store) ValidateRetention(horizon time.Duration) error {
	if s.cfg.SucceededRetention < horizon {
		return fmt.Errorf("%w: SucceededRetention %s < broker redelivery horizon %s", ErrRetentionTooShort, s.cfg.SucceededRetention, horizon)
	}
	return nil
}
