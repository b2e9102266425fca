package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/internal/otelx"

	"github.com/idemq/idemq/internal/pgtext"
	"github.com/idemq/idemq/internal/pooler"
	"github.com/idemq/idemq/wire"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Message is one message to publish, written with Add in the caller's
// transaction.
type Message struct {
	// Topic is the destination: a Kafka topic or a RocketMQ topic. Required;
	// 1 to 249 bytes of UTF-8 without NUL.
	Topic string
	// Key is the record key (Kafka) or Keys (RocketMQ). Rows with the same
	// Topic and Key are published in commit order, one key never overtaking
	// itself: Add holds a transaction-level lock on the key until the
	// transaction ends, so concurrent writers of one key take turns. Nil or
	// empty means no key: such rows are published in any order and take no
	// lock. At most 16 KiB.
	Key []byte
	// Headers become Kafka headers or RocketMQ user properties. Names must be
	// non-empty, and neither names nor values may hold NUL (Postgres jsonb
	// cannot store it). The message-ID and causation header names
	// (Config.MessageIDHeader, Config.CausationHeader unless
	// Config.DisableCausation) are reserved: the relay sets them. When Add's
	// ctx carries a valid OpenTelemetry span and Headers has no
	// wire.TraceparentHeader, Add stores the W3C traceparent (and
	// tracestate) of that span with the row, so the consumer of the message
	// continues the trace.
	Headers map[string]string
	// Payload is the message body, published byte for byte. Nil is stored
	// as NULL and published as no value (a Kafka tombstone when Key is set;
	// RocketMQ brokers may refuse an empty body).
	Payload []byte
	// CausationID is the dedup identity of the message whose handler wrote
	// this row, for tracing (see Causation); "" when none. Stored in the
	// causation_id column and published in Config.CausationHeader (unless
	// Config.DisableCausation). At most
	// 1024 bytes of UTF-8 without NUL.
	CausationID string
	// Delay holds the row back: it is not published before the database's
	// now() at insert plus Delay. Default 0 (publish as soon as committed).
	// Must not be negative. A delayed row also holds back the later rows of
	// its key.
	Delay time.Duration
	// MessageID, when not "", is the message ID the row is published under
	// (the value of Config.MessageIDHeader) instead of the row's UUIDv7: a
	// caller-chosen ID, e.g. to republish a dead letter under its own
	// message ID so the consumer's dedup recognises it
	// (pgstore.Store.RepublishDeadLetter). The row still gets its UUIDv7
	// (Add's return value, Row.ID, Envelope.ID), which the outbox's own
	// bookkeeping uses. Default "": the UUIDv7 is the message ID. At most
	// wire.MaxMessageIDBytes (255) bytes of UTF-8 without NUL, not blank.
	MessageID string
}

// Causation returns the causation ID of a handled message: the string form
// of its dedup identity ("scope/message ID[/business key]"), or "" for nil.
// Use it to fill Message.CausationID from inside a pgstore.Handler.
func Causation(m *dedup.Message) string {
	if m == nil || m.Identity.MessageID == "" {
		return ""
	}
	return m.Identity.String()
}

// Envelope is a row as the relay publishes it. Headers already hold the
// message-ID header (and the causation header when the row has one).
type Envelope struct {
	// ID is the row's UUIDv7. Its canonical text form is the value of the
	// message-ID header unless the row has a caller-chosen MessageID.
	ID uuid.UUID
	// MessageID is the value of the message-ID header, as Outbox.Envelope
	// sets both: the row's Message.MessageID when it had one, else ID's
	// canonical text form. Publishers send Headers (which hold it); this
	// field is for logs and tests.
	MessageID string
	// Topic is the destination topic.
	Topic string
	// Key is the record key; nil when the row has none.
	Key []byte
	// Headers are the headers to publish, including the message-ID header.
	Headers map[string]string
	// Payload is the body.
	Payload []byte
}

// Errors returned by Add and AddBatch.
var (
	// ErrInvalidMessage is wrapped by every validation error of Add and
	// AddBatch; the error names the field and, for a batch, the index.
	ErrInvalidMessage = errors.New("idemq/outbox: invalid message")
	// ErrNilTx is returned by Add and AddBatch when tx is nil: outbox rows
	// must be written in the transaction of the business writes.
	ErrNilTx = errors.New("idemq/outbox: nil transaction (rows must be written in the caller's transaction)")
	// ErrNoPool is returned by methods that need a database pool (Migrate,
	// NewRelay, the admin methods) on an Outbox built without one.
	ErrNoPool = errors.New("idemq/outbox: no pool (New was given nil)")
)

// Limits on message fields, in bytes.
const (
	// MaxTopicBytes is the longest topic name Add accepts: 249 (Kafka's limit).
	MaxTopicBytes = 249
	// MaxKeyBytes is the longest key Add accepts: 16 KiB.
	MaxKeyBytes = 16 << 10
	// MaxCausationBytes is the longest causation ID Add accepts.
	MaxCausationBytes = 1024
	// MaxBatch is the most messages one AddBatch call accepts: 100,000.
	MaxBatch = 100_000
)

// Outbox writes messages into the outbox table inside callers' transactions,
// and gives the relay and operators access to the table. It is safe for
// concurrent use.
type Outbox struct {
	pool *pgxpool.Pool
	cfg  Config
	q    queries
}

// New validates cfg and returns an Outbox on pool. pool may be nil when the
// Outbox is only used for Add and AddBatch, which write through the caller's
// transaction; Migrate, NewRelay and the admin methods then return ErrNoPool.
// New does not touch the database; call Migrate once at start. Errors wrap
// ErrInvalidConfig.
func New(pool *pgxpool.Pool, cfg Config) (*Outbox, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.TransactionPooler {
		if err := pooler.CheckExecMode(pool, "outbox.Config.TransactionPooler", ErrInvalidConfig); err != nil {
			return nil, err
		}
	}
	q, err := newQueries(cfg)
	if err != nil {
		return nil, err
	}
	return &Outbox{pool: pool, cfg: cfg, q: q}, nil
}

// Config returns the outbox configuration with defaults applied.
func (o *Outbox) Config() Config { return o.cfg }

// Pool returns the pool given to New (nil if none).
func (o *Outbox) Pool() *pgxpool.Pool { return o.pool }

var defaultOutbox = sync.OnceValue(func() *Outbox {
	o, err := New(nil, Config{})
	if err != nil {
		panic(err)
	}
	return o
})

// Add writes msg into the default outbox table (schema "idemq", table
// "outbox") in tx; see Outbox.Add.
func Add(ctx context.Context, tx pgx.Tx, msg Message) (uuid.UUID, error) {
	return defaultOutbox().Add(ctx, tx, msg)
}

// AddBatch writes msgs into the default outbox table in tx; see
// Outbox.AddBatch.
func AddBatch(ctx context.Context, tx pgx.Tx, msgs []Message) ([]uuid.UUID, error) {
	return defaultOutbox().AddBatch(ctx, tx, msgs)
}

// Add writes msg as one outbox row in tx, the caller's transaction (in a
// pgstore.Handler: the tx it is given), and returns the row's message ID, a
// UUIDv7 (time-ordered). The row becomes visible to relays when tx commits
// and vanishes if tx rolls back. Unless Config.DisableNotify, the same
// statement sends a pg_notify that Postgres delivers at commit. Cost: one
// round trip.
//
// Errors: ErrNilTx; ErrInvalidMessage (wrapped, naming the field); a
// database error, after which tx is aborted (SQLSTATE 25P02) and must be
// rolled back (a pgstore.Handler returns the error and idemq rolls back).
func (o *Outbox) Add(ctx context.Context, tx pgx.Tx, msg Message) (uuid.UUID, error) {
	ids, err := o.AddBatch(ctx, tx, []Message{msg})
	if err != nil {
		return uuid.Nil, err
	}
	return ids[0], nil
}

// AddBatch writes msgs in one statement (one round trip, unnest of arrays) in
// tx and returns their message IDs in the same order. Rows of one key are
// ordered as in msgs. An empty msgs writes nothing and returns nil. All
// messages are validated before anything is written; the first invalid one
// fails the call. Errors as Add; more than MaxBatch messages is
// ErrInvalidMessage.
func (o *Outbox) AddBatch(ctx context.Context, tx pgx.Tx, msgs []Message) ([]uuid.UUID, error) {
	if tx == nil {
		return nil, ErrNilTx
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	if len(msgs) > MaxBatch {
		return nil, fmt.Errorf("%w: %d messages in one batch, at most %d", ErrInvalidMessage, len(msgs), MaxBatch)
	}
	n := len(msgs)
	var (
		ids      = make([]uuid.UUID, n)
		idText   = make([]string, n)
		topics   = make([]string, n)
		keys     = make([][]byte, n)
		headers  = make([]string, n)
		payloads = make([][]byte, n)
		causes   = make([]string, n)
		delays   = make([]float64, n)
		msgIDs   = make([]string, n)
	)
	for i := range msgs {
		m := &msgs[i]
		if err := o.validate(m); err != nil {
			if n > 1 {
				return nil, fmt.Errorf("message %d: %w", i, err)
			}
			return nil, err
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("idemq/outbox: new message ID: %w", err)
		}
		ids[i], idText[i] = id, id.String()
		topics[i] = m.Topic
		if len(m.Key) > 0 {
			keys[i] = m.Key
		}
		// The trace context of the handler's span travels with the message,
		// so the next consumer's span continues the trace.
		h := otelx.Inject(ctx, o.cfg.Propagator, m.Headers)
		if h == nil {
			h = map[string]string{}
		}
		b, err := json.Marshal(h)
		if err != nil {
			return nil, fmt.Errorf("%w: headers: %v", ErrInvalidMessage, err)
		}
		headers[i] = string(b)
		payloads[i] = m.Payload
		causes[i] = m.CausationID
		delays[i] = m.Delay.Seconds()
		msgIDs[i] = m.MessageID
	}
	for _, k := range keys {
		if k != nil {
			var locked int
			if err := tx.QueryRow(ctx, o.q.lockKeysSQL, topics, keys, o.q.table).Scan(&locked); err != nil {
				return nil, fmt.Errorf("idemq/outbox: lock keys: %w", err)
			}
			break
		}
	}
	var inserted int
	var notified bool
	err := tx.QueryRow(ctx, o.q.insertSQL, idText, topics, keys, headers, payloads, causes, delays, o.q.channel, msgIDs).
		Scan(&inserted, &notified)
	if err != nil {
		return nil, fmt.Errorf("idemq/outbox: insert %d rows: %w", n, err)
	}
	if inserted != n {
		return nil, fmt.Errorf("idemq/outbox: inserted %d of %d rows", inserted, n)
	}
	return ids, nil
}

func (o *Outbox) validate(m *Message) error {
	switch {
	case m.Topic == "" || len(m.Topic) > MaxTopicBytes || !utf8.ValidString(m.Topic) || strings.IndexByte(m.Topic, 0) >= 0:
		return fmt.Errorf("%w: Topic %q must be 1 to %d bytes of UTF-8 without NUL", ErrInvalidMessage, clip(m.Topic, 64), MaxTopicBytes)
	case len(m.Key) > MaxKeyBytes:
		return fmt.Errorf("%w: Key is %d bytes, at most %d", ErrInvalidMessage, len(m.Key), MaxKeyBytes)
	case len(m.CausationID) > MaxCausationBytes || !utf8.ValidString(m.CausationID) || strings.IndexByte(m.CausationID, 0) >= 0:
		return fmt.Errorf("%w: CausationID must be at most %d bytes of UTF-8 without NUL", ErrInvalidMessage, MaxCausationBytes)
	case m.Delay < 0:
		return fmt.Errorf("%w: Delay %s is negative", ErrInvalidMessage, m.Delay)
	case m.MessageID != "" && (strings.TrimSpace(m.MessageID) == "" || len(m.MessageID) > wire.MaxMessageIDBytes ||
		!utf8.ValidString(m.MessageID) || strings.IndexByte(m.MessageID, 0) >= 0):
		return fmt.Errorf("%w: MessageID must be at most %d bytes of UTF-8 without NUL, not blank", ErrInvalidMessage, wire.MaxMessageIDBytes)
	}
	for k, v := range m.Headers {
		switch {
		case k == "" || strings.IndexByte(k, 0) >= 0 || !utf8.ValidString(k):
			return fmt.Errorf("%w: header name %q must be non-empty UTF-8 without NUL", ErrInvalidMessage, clip(k, 64))
		case strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v):
			return fmt.Errorf("%w: header %q value must be UTF-8 without NUL", ErrInvalidMessage, clip(k, 64))
		case k == o.cfg.MessageIDHeader || (k == o.cfg.CausationHeader && !o.cfg.DisableCausation):
			return fmt.Errorf("%w: header %q is reserved: the relay sets it", ErrInvalidMessage, k)
		}
	}
	return nil
}

// Envelope returns the envelope the relay publishes for row: its headers plus
// the message-ID header (Row.MessageID, or else the row's ID) and, when the row has a causation ID and
// Config.DisableCausation is false, the causation header. Every publish of a
// row (first publish and republishes) uses the same envelope.
func (o *Outbox) Envelope(row Row) Envelope {
	h := make(map[string]string, len(row.Headers)+2)
	for k, v := range row.Headers {
		h[k] = v
	}
	mid := row.MessageID
	if mid == "" {
		mid = row.ID.String()
	}
	h[o.cfg.MessageIDHeader] = mid
	if row.CausationID != "" && !o.cfg.DisableCausation {
		h[o.cfg.CausationHeader] = row.CausationID
	}
	var key []byte
	if len(row.Key) > 0 {
		key = row.Key
	}
	return Envelope{ID: row.ID, MessageID: mid, Topic: row.Topic, Key: key, Headers: h, Payload: row.Payload}
}

// clip makes s storable in a text column (see pgtext.Clip).
func clip(s string, n int) string { return pgtext.Clip(s, n) }
