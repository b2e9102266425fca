package dedup

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemq/idemq/wire"
)

// MaxKeyBytes is the longest message ID or business key stored as given:
// 255 bytes (wire.MaxMessageIDBytes, the wire contract's rule). Longer keys
// are stored in their hashed form (see NormalizeKey).
const MaxKeyBytes = wire.MaxMessageIDBytes

// HashedKeyPrefix starts every key stored in hashed form: "sha256:" followed by
// 64 lowercase hex digits of the SHA-256 of the raw key bytes
// (wire.HashedIDPrefix).
const HashedKeyPrefix = wire.HashedIDPrefix

// MatchedBy names which unique key of the consumption record a duplicate or
// conflict matched.
type MatchedBy string

const (
	// ByMessageID means the delivery's message ID already has a record.
	ByMessageID MatchedBy = "message_id"
	// ByBusinessKey means another message with the same business key has a
	// record.
	ByBusinessKey MatchedBy = "business_key"
)

// Identity is the dedup identity of a delivery: unique (Scope, MessageID) and,
// when BusinessKey is not empty, unique (Scope, BusinessKey). Build it with
// NewIdentity so both keys are normalized.
type Identity struct {
	// Scope is who consumes: the consumer group name, optionally with a tenant.
	Scope string
	// MessageID identifies one message across broker redelivery.
	MessageID string
	// BusinessKey identifies one business intent across producer re-sends;
	// empty means "none" and never matches anything.
	BusinessKey string
}

// String renders the identity for logs: scope/message ID[/business key].
func (id Identity) String() string {
	if id.BusinessKey == "" {
		return id.Scope + "/" + id.MessageID
	}
	return id.Scope + "/" + id.MessageID + "/" + id.BusinessKey
}

// ErrInvalidScope is returned by NewIdentity and ValidateScope for a scope that
// is empty, longer than MaxKeyBytes, not valid UTF-8 or holds a NUL byte.
var ErrInvalidScope = errors.New("idemq: invalid scope")

// ErrEmptyMessageID is returned by NewIdentity when both the message ID and
// its position fallback are blank (see IsBlank).
var ErrEmptyMessageID = errors.New("idemq: empty message ID and no position fallback")

// ValidateScope reports whether scope can be used as is (scopes come from
// configuration, so they are validated rather than hashed).
func ValidateScope(scope string) error {
	if scope == "" || len(scope) > MaxKeyBytes || !utf8.ValidString(scope) || strings.IndexByte(scope, 0) >= 0 {
		return fmt.Errorf("%w: %q must be 1 to %d bytes of UTF-8 without NUL", ErrInvalidScope, truncate(scope, 64), MaxKeyBytes)
	}
	return nil
}

// IsBlank reports whether key is empty or holds only white space, as
// unicode.IsSpace defines it: ' ', '\t', '\n', '\v', '\f', '\r', U+0085,
// U+00A0 and the Unicode space separators (U+2000–U+200A, U+2028, U+2029,
// U+202F, U+205F, U+3000 and U+1680). It is idemq's one rule for absent keys,
// used by NewIdentity, NormalizeKey and the broker adapters:
//
//   - a blank message ID (a `message-id` header or property of "", " ",
//     "\t" …) is absent: the next source of the ID applies (RocketMQ: the
//     UNIQ_KEY), and in the end the broker position identity;
//   - a blank business key is no business key: it never matches another
//     message, where a shared " " key would make every such message a
//     duplicate or a conflict of the first.
//
// Keys that are not blank are used exactly as given: surrounding white
// space is not trimmed, so " m-1" and "m-1" stay different IDs. Invalid UTF-8
// is not white space (it is not blank).
//
// It is wire.IsBlank, the wire contract's rule.
func IsBlank(key string) bool { return wire.IsBlank(key) }

// NewIdentity builds a normalized identity. messageID is the message's own ID
// (a header or property); when it is blank (IsBlank), fallbackID (the broker
// position, e.g. "kafka:payments/2/1041") is used instead. A blank
// businessKey is none (""). Both keys pass through NormalizeKey. It returns
// ErrInvalidScope, or ErrEmptyMessageID when messageID and fallbackID are
// both blank.
func NewIdentity(scope, messageID, fallbackID, businessKey string) (Identity, error) {
	if err := ValidateScope(scope); err != nil {
		return Identity{}, err
	}
	if IsBlank(messageID) {
		messageID = fallbackID
	}
	if IsBlank(messageID) {
		return Identity{}, ErrEmptyMessageID
	}
	return Identity{Scope: scope, MessageID: NormalizeKey(messageID), BusinessKey: NormalizeKey(businessKey)}, nil
}

// NormalizeKey returns the stored form of a message ID or business key: the
// key itself when it is at most MaxKeyBytes bytes of valid UTF-8 without NUL
// and does not itself start with HashedKeyPrefix; otherwise "sha256:" plus the
// hex SHA-256 of the raw bytes. The result is deterministic and at most
// MaxKeyBytes bytes long. A blank key (IsBlank: empty or only white space)
// is no key and becomes "", so a blank business key never matches anything.
func NormalizeKey(raw string) string {
	if IsBlank(raw) {
		return ""
	}
	if wire.CheckMessageID(raw) == nil {
		return raw
	}
	sum := sha256.Sum256([]byte(raw))
	return HashedKeyPrefix + hex.EncodeToString(sum[:])
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
