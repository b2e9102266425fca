package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// RelayConfig configures a Relay. Every zero value means the default given in
// the field's comment.
type RelayConfig struct {
	// Name identifies this relay instance in logs and in the published_by
	// column. Default "<hostname>-<pid>-<4 random hex digits>". At most 255
	// bytes.
	Name string
	// BatchSize is the most rows one claim transaction publishes: the
	// earliest unpublished row (head) of up to MaxKeys keys, then up to
	// (BatchSize−heads)/heads following rows of each of those keys, so
	// BatchSize rows in all at most. Default 500; 1 to
	// 10,000. The rows stay locked (FOR UPDATE) while they are published,
	// so a larger batch holds more locks for longer.
	BatchSize int
	// MaxKeys is the most keys one batch takes (its heads). Default
	// BatchSize; 1 to BatchSize. Relays share work by key: a key whose head
	// one relay holds is skipped by the others, so with few keys a lower
	// MaxKeys lets several relays work at once, at the cost of more rounds
	// per batch (a batch of BatchSize rows over MaxKeys keys needs about
	// BatchSize/MaxKeys publish rounds). Only keys whose head is due take a
	// place: a key whose head is parked, delayed or waiting out a retry
	// delay is stepped over, and the places go to the heads due the
	// longest (a refused head queues again from its retry time), so keys
	// the broker keeps refusing never hold the places of the others.
	MaxKeys int
	// Workers is how many claim transactions one relay runs at once, each on
	// its own connection. Default 1; 1 to 64. Several relays (processes)
	// may run against one table as well; they share work through SKIP
	// LOCKED.
	Workers int
	// PollInterval is how often an idle worker looks for rows without being
	// woken: the fallback when a notification is lost, when LISTEN is off,
	// and for rows whose retry time or Delay has come. While the LISTEN
	// connection is down, FallbackPollInterval applies instead. Default 1s;
	// 10ms to 1h.
	PollInterval time.Duration
	// FallbackPollInterval is how often an idle worker looks for rows while
	// the LISTEN connection is down (lost, or not made yet), when no
	// notification can wake it. When the connection is lost the workers
	// are woken at once and the relay reconnects in the background (with
	// backoff, 200ms doubling to 10s); once it is back they wait
	// PollInterval again. Default 1s or PollInterval, whichever is
	// shorter; 10ms to PollInterval. Unused with DisableListen.
	FallbackPollInterval time.Duration
	// DisableListen turns off LISTEN (one extra connection per relay, held
	// for its lifetime), leaving polling only (every PollInterval). Default
	// false (listen).
	DisableListen bool
	// PublishTimeout bounds one Publish call (one round of a batch: at most
	// one row per key). A publish that times out counts as failed. Default
	// 30s; 100ms to 10m.
	PublishTimeout time.Duration
	// StatementTimeout bounds each of the relay's steps on Postgres: the
	// claim (with its BEGIN and the pool's dial), the check of the claim
	// between rounds, the marks with the COMMIT, and a rollback. The marks
	// and a rollback run on a context detached from the relay's, so a
	// graceful stop still records what was published. A connection that
	// stops answering (a black hole, a frozen server) is detected within
	// it: pgx closes the connection and the batch counts as lost (a
	// DBError; its published rows are published again). Default 30s; 100ms
	// to 1h.
	StatementTimeout time.Duration
	// RetryInitial is the delay before a row whose publish failed is tried
	// again; it doubles with each further failure (±20% jitter) up to
	// RetryMax. Default 1s; 1ms to RetryMax. The row's later rows (same
	// key) wait behind it.
	RetryInitial time.Duration
	// RetryMax caps the retry delay. Default 5m; at least RetryInitial, at
	// most 24h.
	RetryMax time.Duration
	// MaxAttempts is how many failed publishes park a row: it keeps its last
	// error, is no longer tried, and holds back the later rows of its key,
	// until an operator calls Outbox.Unpark. Rows are never dropped. Only
	// row errors count; a broker outage does not (see
	// OutageBackoffInitial).
	// Default 25 (with the default delays, about 1.5 hours of retries);
	// 1 to 1,000,000.
	MaxAttempts int
	// OutageBackoffInitial is how long the relay pauses publishing when a
	// publish fails because the broker is unavailable (IsUnavailable:
	// connection refused, timeouts, no leader, not enough replicas). Such
	// failures never count toward MaxAttempts. After the pause one worker
	// publishes a probe batch; while probes fail the pause doubles (±20%
	// jitter) up to OutageBackoffMax, and the first probe that gets through
	// resumes publishing. Default 1s; 10ms to OutageBackoffMax.
	OutageBackoffInitial time.Duration
	// OutageBackoffMax caps the pause between probes during a broker
	// outage, so publishing resumes at most about this long after the
	// broker is back. Default 1m; OutageBackoffInitial to 1h.
	OutageBackoffMax time.Duration
	// MaxErrorBytes bounds the last_error text, in bytes. Default 2048; at
	// least 64.
	MaxErrorBytes int
	// Retention is how long published rows are kept before the relay purges
	// them (database time): a purge deletes rows published more than
	// Retention ago. Default 24h; must not be negative (zero means the
	// default). Set DisablePurge to keep rows forever.
	Retention time.Duration
	// DisablePurge turns the relay's purge off: published rows are kept
	// until someone deletes them (Outbox.Purge, or SQL). Default false
	// (purge every PurgeInterval). With it set, Retention, PurgeInterval
	// and PurgeBatch must be left zero.
	DisablePurge bool
	// PurgeInterval is how often the relay purges. Default 1m; at least 1s.
	PurgeInterval time.Duration
	// PurgeBatch is how many rows one purge statement deletes; a purge runs
	// statements until fewer are left. Default 1000; 1 to 100,000.
	PurgeBatch int
	// ShutdownGrace is how long in-flight batches may finish (publish and
	// mark) after Run's context ends. After it, their publish is canceled
	// and what was published is still marked. Default 10s; not negative.
	ShutdownGrace time.Duration
	// SkipSchemaCheck turns off the check Run does first by default: the
	// outbox's read-only CheckSchema (one SELECT, no lock, no DDL, so a
	// data-only role passes it), which stops Run with a *SchemaError
	// (ErrSchemaMissing / ErrSchemaOutdated, naming the versions and the
	// command to run) instead of relaying on a schema that is missing or
	// older than the binary. Default false: the check runs. Set it only for
	// an outbox table managed without idemq's version table; Run then only
	// probes that the table can be read.
	SkipSchemaCheck bool
	// Logger receives warnings (failed publishes, database errors) and
	// errors (parked rows). Default slog.Default().
	Logger *slog.Logger
	// TracerProvider makes one OpenTelemetry producer span per row
	// published ("send <topic>", messaging.operation.type "send",
	// messaging.message.id the row's ID, messaging.system when the
	// Publisher implements MessagingSystem), child of the trace context
	// stored in the row's headers when Add's ctx had one; the published
	// headers carry the send span's context instead. The span ends with
	// status Ok when the broker acknowledged the row, Error (with the
	// error recorded) when the publish failed. Default: the global provider
	// (otel.GetTracerProvider()); no span is built while it cannot record.
	TracerProvider trace.TracerProvider
}

// testSignals are fault-injection points set only by this package's tests
// (River's testSignals pattern); the zero value injects nothing.
type testSignals struct {
	// beforeListen runs before each attempt to make the LISTEN connection
	// (the first, and every reconnect after a loss). A non-nil error fails
	// that attempt as a lost connection would. It may block to hold the
	// connection down (until ctx ends).
	beforeListen func(ctx context.Context) error
}

func (c RelayConfig) withDefaults() RelayConfig {
	if c.Name == "" {
		host, _ := os.Hostname()
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		c.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defInt(&c.BatchSize, 500)
	defInt(&c.MaxKeys, c.BatchSize)
	defInt(&c.Workers, 1)
	def(&c.PollInterval, time.Second)
	def(&c.FallbackPollInterval, min(time.Second, c.PollInterval))
	def(&c.PublishTimeout, 30*time.Second)
	def(&c.StatementTimeout, 30*time.Second)
	def(&c.RetryInitial, time.Second)
	def(&c.RetryMax, 5*time.Minute)
	defInt(&c.MaxAttempts, 25)
	def(&c.OutageBackoffInitial, time.Second)
	def(&c.OutageBackoffMax, max(time.Minute, c.OutageBackoffInitial))
	defInt(&c.MaxErrorBytes, 2048)
	if !c.DisablePurge {
		def(&c.Retention, 24*time.Hour)
		def(&c.PurgeInterval, time.Minute)
		defInt(&c.PurgeBatch, 1000)
	}
	def(&c.ShutdownGrace, 10*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	return c
}

func (c RelayConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case len(c.Name) > 255:
		return bad("Name is %d bytes, at most 255", len(c.Name))
	case c.BatchSize < 1 || c.BatchSize > 10_000:
		return bad("BatchSize %d must be 1 to 10000", c.BatchSize)
	case c.MaxKeys < 1 || c.MaxKeys > c.BatchSize:
		return bad("MaxKeys %d must be 1 to BatchSize (%d)", c.MaxKeys, c.BatchSize)
	case c.Workers < 1 || c.Workers > 64:
		return bad("Workers %d must be 1 to 64", c.Workers)
	case c.PollInterval < 10*time.Millisecond || c.PollInterval > time.Hour:
		return bad("PollInterval %s must be 10ms to 1h", c.PollInterval)
	case c.FallbackPollInterval < 10*time.Millisecond || c.FallbackPollInterval > c.PollInterval:
		return bad("FallbackPollInterval %s must be 10ms to PollInterval (%s)", c.FallbackPollInterval, c.PollInterval)
	case c.PublishTimeout < 100*time.Millisecond || c.PublishTimeout > 10*time.Minute:
		return bad("PublishTimeout %s must be 100ms to 10m", c.PublishTimeout)
	case c.StatementTimeout < 100*time.Millisecond || c.StatementTimeout > time.Hour:
		return bad("StatementTimeout %s must be 100ms to 1h", c.StatementTimeout)
	case c.RetryInitial < time.Millisecond || c.RetryMax < c.RetryInitial || c.RetryMax > 24*time.Hour:
		return bad("RetryInitial %s and RetryMax %s must satisfy 1ms <= RetryInitial <= RetryMax <= 24h", c.RetryInitial, c.RetryMax)
	case c.MaxAttempts < 1 || c.MaxAttempts > 1_000_000:
		return bad("MaxAttempts %d must be 1 to 1000000", c.MaxAttempts)
	case c.OutageBackoffInitial < 10*time.Millisecond || c.OutageBackoffMax < c.OutageBackoffInitial || c.OutageBackoffMax > time.Hour:
		return bad("OutageBackoffInitial %s and OutageBackoffMax %s must satisfy 10ms <= OutageBackoffInitial <= OutageBackoffMax <= 1h", c.OutageBackoffInitial, c.OutageBackoffMax)
	case c.MaxErrorBytes < 64:
		return bad("MaxErrorBytes %d must be at least 64", c.MaxErrorBytes)
	case c.ShutdownGrace < 0:
		return bad("ShutdownGrace %s must not be negative", c.ShutdownGrace)
	case c.DisablePurge && (c.Retention != 0 || c.PurgeInterval != 0 || c.PurgeBatch != 0):
		return bad("Retention %s, PurgeInterval %s and PurgeBatch %d must be left zero with DisablePurge", c.Retention, c.PurgeInterval, c.PurgeBatch)
	case c.DisablePurge:
		// nothing more to check: the relay does not purge
	case c.Retention < 0:
		return bad("Retention %s must not be negative; to keep published rows forever set DisablePurge", c.Retention)
	case c.PurgeInterval < time.Second:
		return bad("PurgeInterval %s must be at least 1s", c.PurgeInterval)
	case c.PurgeBatch < 1 || c.PurgeBatch > 100_000:
		return bad("PurgeBatch %d must be 1 to 100000", c.PurgeBatch)
	}
	return nil
}
