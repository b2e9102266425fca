package dedup

import (
	"errors"
	"time"
)

// Record is a consumption record as stored, for inspection and tests. JSON
// field names are the table's column names.
type Record struct {
	// Scope, MessageID and BusinessKey are the identity, normalized
	// (NormalizeKey); BusinessKey is "" when the message had none.
	Scope       string `json:"scope"`
	MessageID   string `json:"message_id"`
	BusinessKey string `json:"business_key"`
	// Fingerprint is the HMAC-SHA256 of the payload (32 bytes; empty for a
	// record of bad input whose payload could not be fingerprinted) under the
	// key FingerprintKeyID.
	Fingerprint      []byte `json:"fingerprint"`
	FingerprintKeyID string `json:"fingerprint_key_id"`
	// Status is the record's state.
	Status Status `json:"status"`
	// Attempts counts handler executions started.
	Attempts int `json:"attempts"`
	// LastError and LastErrorClass describe the latest failure (ErrorClass;
	// the text bounded by Config.MaxErrorBytes); "" when none.
	LastError      string `json:"last_error"`
	LastErrorClass string `json:"last_error_class"`
	// Fence grows by one at every lease-mode claim or takeover; 0 for
	// records only ever handled in atomic mode.
	Fence int64 `json:"fence"`
	// Source is the broker position of the latest copy handled, e.g.
	// "kafka:payments/2/1041".
	Source string `json:"source"`
	// ReconsumeTimes is RocketMQ's counter on the latest copy handled.
	ReconsumeTimes int32 `json:"reconsume_times"`
	// CreatedAt and UpdatedAt are database times.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// ExpiresAt is nil while the record must be kept (not final yet).
	ExpiresAt *time.Time `json:"expires_at"`
}

// ErrNotFound is returned by Lookup and Redrive when no record matches, and
// (wrapped, naming the ID) by the stores' DeadLetter and
// pgstore.Store.RepublishDeadLetter when no dead letter has the ID.
var ErrNotFound = errors.New("idemq: record not found")

// ErrNotFinal is returned by Redrive for a record that exists but is not
// FAILED_FINAL (only final failures can be re-driven); the error names the
// record's status.
var ErrNotFinal = errors.New("idemq: record is not FAILED_FINAL")

// DeadLetter is one row of the dead-letter table: a delivery that could not
// be applied, kept whole.
type DeadLetter struct {
	// ID orders dead letters (use it as the DeadLetters cursor).
	ID int64
	// Scope, MessageID and BusinessKey are the delivery's identity.
	Scope, MessageID, BusinessKey string
	// Reason is one of the Reason* constants.
	Reason string
	// Error and ErrorClass are the cause (ErrorClass of the error).
	Error, ErrorClass string
	// Attempts is the record's attempts when the delivery was dead-lettered.
	Attempts int
	// Topic, Key, Payload and Headers are the message as delivered.
	Topic        string
	Key, Payload []byte
	Headers      map[string]string
	// Source is the broker position of the copy.
	Source string
	// CreatedAt is the database time of the dead-lettering.
	CreatedAt time.Time
	// RedrivenAt is set once an operator re-drove the record (Redrive).
	RedrivenAt *time.Time
	// RedrivenAs is the derived message ID under which RedriveAsNew
	// re-drove this dead letter as a new message; "" when it did not.
	RedrivenAs string
}
