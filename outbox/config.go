package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/idemq/idemq/internal/pooler"
	"github.com/idemq/idemq/wire"
	"go.opentelemetry.io/otel/propagation"
)

// Config configures an Outbox. The zero value of every field means "use the
// default" given in the field's comment.
type Config struct {
	// Schema holds the outbox table. Default "idemq" (the schema of the
	// dedup tables, so one Migrate per package sets up one schema). Created
	// by Migrate if absent. A lowercase SQL identifier: [a-z_][a-z0-9_]{0,39}.
	Schema string
	// Table is the outbox table. Default "outbox". Same identifier rule as
	// Schema. Migrate records its version in <Table>_schema_version.
	Table string
	// MessageIDHeader is the header (Kafka) or user property (RocketMQ) that
	// carries a row's message ID (its UUIDv7, canonical text form) on
	// publish. Default wire.MessageIDHeader (message-id), the name idemq's
	// broker adapters read. 1 to 255 bytes without NUL; must differ from
	// CausationHeader. Add rejects messages that set it themselves.
	MessageIDHeader string
	// CausationHeader is the header that carries a row's causation ID (the
	// dedup identity of the message whose handler wrote it) on publish, when
	// the row has one. Default wire.CausationHeader (causation-id). 1 to 255
	// bytes without NUL; must differ from MessageIDHeader. Add rejects
	// messages that set it themselves, unless DisableCausation is set.
	CausationHeader string
	// DisableCausation publishes no causation header: rows still store their
	// causation ID (the causation_id column, Row.CausationID), and Add lets
	// messages use the CausationHeader name as an ordinary header. Default
	// false (publish it). With it set, CausationHeader must be left empty.
	DisableCausation bool
	// DisableNotify turns off the pg_notify that Add sends in the same
	// statement, which wakes relays blocked in LISTEN as soon as the
	// transaction commits. Default false (notify). Turn it off when many
	// writers commit at very high rates (NOTIFY takes a global lock at
	// commit); relays then find rows by polling (RelayConfig.PollInterval).
	DisableNotify bool
	// Propagator writes the trace context and baggage of Add's ctx into
	// the row's headers, and the relay reads them back for its send span.
	// Default nil: the global propagator (otel.GetTextMapPropagator()) once
	// the application has set one, W3C Trace Context plus W3C Baggage until
	// then.
	Propagator propagation.TextMapPropagator
	// TransactionPooler says New's pool reaches Postgres through a
	// connection pooler in transaction mode (PgBouncer pool_mode =
	// transaction, RDS Proxy, Supavisor), which keeps a client on one
	// server session only for a transaction; idemq cannot detect one, so
	// set it yourself. Default false. When set, New refuses a pool whose
	// DefaultQueryExecMode is QueryExecModeCacheStatement (the pgx
	// default) or QueryExecModeDescribeExec (use QueryExecModeExec or
	// QueryExecModeSimpleProtocol); Migrate (a session advisory lock)
	// returns an error wrapping ErrNeedsSession (run it on an Outbox built
	// on a direct pool); NewRelay refuses a RelayConfig without
	// DisableListen (LISTEN needs a session: the relay then polls every
	// PollInterval). Add, the relay's claims and marks, and the admin
	// functions work through it.
	TransactionPooler bool
}

// ErrNeedsSession is returned by Migrate when Config.TransactionPooler is
// set: its advisory lock is a session lock, which a transaction pooler
// does not keep. It is pgstore.ErrNeedsSession.
var ErrNeedsSession = pooler.ErrNeedsSession

var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

// ErrInvalidConfig is wrapped by every configuration error of this package
// (New's Config, NewRelay's RelayConfig and arguments); the error names the
// field.
var ErrInvalidConfig = errors.New("idemq/outbox: invalid config")

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = "idemq"
	}
	if c.Table == "" {
		c.Table = "outbox"
	}
	if c.MessageIDHeader == "" {
		c.MessageIDHeader = wire.MessageIDHeader
	}
	if c.CausationHeader == "" && !c.DisableCausation {
		c.CausationHeader = wire.CausationHeader
	}
	return c
}

// validate checks c after withDefaults. "-", the old way to turn causation
// off, is refused with a pointer to DisableCausation.
func (c Config) validate() error {
	for _, f := range []struct{ name, v string }{{"Schema", c.Schema}, {"Table", c.Table}} {
		if !identRe.MatchString(f.v) {
			return fmt.Errorf("%w: %s %q must match %s", ErrInvalidConfig, f.name, f.v, identRe)
		}
	}
	if c.CausationHeader == "-" {
		return fmt.Errorf("%w: CausationHeader %q is a header name; to publish no causation header set DisableCausation", ErrInvalidConfig, c.CausationHeader)
	}
	if c.DisableCausation && c.CausationHeader != "" {
		return fmt.Errorf("%w: CausationHeader %q is set together with DisableCausation; leave it empty", ErrInvalidConfig, c.CausationHeader)
	}
	headers := []struct{ name, v string }{{"MessageIDHeader", c.MessageIDHeader}}
	if !c.DisableCausation {
		headers = append(headers, struct{ name, v string }{"CausationHeader", c.CausationHeader})
	}
	for _, f := range headers {
		if f.v == "" || len(f.v) > 255 || strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("%w: %s %q must be 1 to 255 bytes without NUL", ErrInvalidConfig, f.name, f.v)
		}
	}
	if c.MessageIDHeader == c.CausationHeader {
		return fmt.Errorf("%w: MessageIDHeader and CausationHeader are both %q", ErrInvalidConfig, c.MessageIDHeader)
	}
	return nil
}

// channel is the LISTEN/NOTIFY channel of an outbox table: "<schema>.<table>",
// shortened with a hash to fit Postgres's 63-byte identifier limit.
func (c Config) channel() string {
	ch := "idemq_outbox:" + c.Schema + "." + c.Table
	if len(ch) <= 63 {
		return ch
	}
	sum := sha256.Sum256([]byte(ch))
	return ch[:46] + "~" + hex.EncodeToString(sum[:8])
}
