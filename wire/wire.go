package wire

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Header and property names. Each is the default of the matching Config field
// of the adapters and the outbox (kafkaadapter.Config.MessageIDHeader,
// rocketmqadapter.Config.MessageIDProperty, outbox.Config.MessageIDHeader,
// outbox.Config.CausationHeader); change one side only together with the
// other.
const (
	// MessageIDHeader is the Kafka header or RocketMQ user property that
	// carries the message ID: message-id.
	MessageIDHeader = "message-id"
	// CausationHeader is the header or property that carries an outbox
	// row's causation ID (the dedup identity of the message whose handler
	// wrote it): causation-id.
	CausationHeader = "causation-id"
	// TraceparentHeader is the W3C Trace Context header that carries the
	// trace and parent span: "traceparent".
	TraceparentHeader = "traceparent"
	// TracestateHeader is the W3C Trace Context header that carries vendor
	// trace state: "tracestate".
	TracestateHeader = "tracestate"
)

// MaxMessageIDBytes is the longest message ID, in bytes, that consumers store
// as given: 255. A longer ID is stored in its hashed form (see the package
// documentation). The same bound applies to business keys and scopes.
const MaxMessageIDBytes = 255

// HashedIDPrefix starts the hashed form of a message ID or business key:
// "sha256:" followed by 64 lowercase hex digits of the SHA-256 of the raw
// bytes. An ID that itself starts with it is hashed too, so a stored form
// never collides with another ID's hash.
const HashedIDPrefix = "sha256:"

// ErrInvalidMessageID is wrapped by every error of CheckMessageID.
var ErrInvalidMessageID = errors.New("idemq/wire: message ID not stored as given")

// IsBlank reports whether a message ID (or business key) is empty or holds
// only white space, as unicode.IsSpace defines it: ' ', '\t', '\n', '\v',
// '\f', '\r', U+0085, U+00A0 and the Unicode space separators. A blank ID is
// no ID (see the package documentation). Invalid UTF-8 is not white space.
func IsBlank(id string) bool { return strings.TrimSpace(id) == "" }

// CheckMessageID returns nil when id is stored and shown exactly as given by
// idemq's consumers: not blank, at most MaxMessageIDBytes bytes of valid
// UTF-8, no NUL byte, not starting with HashedIDPrefix. Otherwise it returns
// an error wrapping ErrInvalidMessageID that names the rule id breaks. It
// allocates only on failure.
func CheckMessageID(id string) error {
	switch {
	case IsBlank(id):
		return fmt.Errorf("%w: blank (empty or only white space)", ErrInvalidMessageID)
	case len(id) > MaxMessageIDBytes:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidMessageID, len(id), MaxMessageIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidMessageID)
	case strings.IndexByte(id, 0) >= 0:
		return fmt.Errorf("%w: holds a NUL byte", ErrInvalidMessageID)
	case strings.HasPrefix(id, HashedIDPrefix):
		return fmt.Errorf("%w: starts with %q, the prefix of hashed IDs", ErrInvalidMessageID, HashedIDPrefix)
	}
	return nil
}
