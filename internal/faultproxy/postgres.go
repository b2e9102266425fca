package faultproxy

import (
	"bytes"
	"encoding/binary"
	"strings"
)

// Postgres is the Postgres frontend/backend protocol (version 3): a request
// is one frontend message (FramePG), and a swallowed reply is whole at
// ReadyForQuery (PGReplyDone), which the server sends after the statement
// finished and, in autocommit or for a COMMIT, committed.
var Postgres = Protocol{Frame: FramePG, ReplyDone: PGReplyDone}

// FramePG returns the length of the first whole Postgres frontend message
// at the start of b: the startup message, SSLRequest or CancelRequest (no
// type byte; the first byte of its int32 length is 0) or a typed message (a
// type byte, then an int32 length that counts itself); 0 if b holds less.
func FramePG(b []byte) int {
	if len(b) < 5 {
		return 0
	}
	if b[0] == 0 {
		n := int(binary.BigEndian.Uint32(b[:4]))
		if len(b) < n {
			return 0
		}
		return n
	}
	n := 1 + int(binary.BigEndian.Uint32(b[1:5]))
	if len(b) < n {
		return 0
	}
	return n
}

// PGReplyDone reports whether swallowed holds a whole ReadyForQuery message
// ('Z', length 5, the transaction status byte).
func PGReplyDone(swallowed []byte) bool {
	i := bytes.Index(swallowed, []byte{'Z', 0, 0, 0, 5})
	return i >= 0 && len(swallowed) > i+5
}

// SQLText returns the SQL text of a Query message ('Q', the simple
// protocol) or of a Parse message ('P', the extended protocol), "" for any
// other message.
func SQLText(req []byte) string {
	if len(req) < 6 {
		return ""
	}
	body := req[5:]
	switch req[0] {
	case 'Q':
		return strings.TrimRight(string(body), "\x00")
	case 'P': // statement name, then the query, each NUL-terminated
		if i := bytes.IndexByte(body, 0); i >= 0 {
			if j := bytes.IndexByte(body[i+1:], 0); j >= 0 {
				return string(body[i+1 : i+1+j])
			}
		}
	}
	return ""
}

// SQLHas matches non-empty SQL text that contains every one of parts.
func SQLHas(parts ...string) func(sql string) bool {
	return func(q string) bool {
		for _, part := range parts {
			if !strings.Contains(q, part) {
				return false
			}
		}
		return q != ""
	}
}

// IsCommit matches a COMMIT (pgx sends it as a Query message, in the simple
// protocol).
func IsCommit(req []byte) bool { return strings.EqualFold(strings.TrimSpace(SQLText(req)), "commit") }

// CommitAfter matches the COMMIT that follows the first statement whose
// text matches stmt: the COMMIT of that statement's transaction when the
// proxy carries one such transaction at a time. The predicate keeps state;
// use a new one for each DropReplyOnce.
func CommitAfter(stmt func(sql string) bool) func(req []byte) bool {
	seen := false
	return func(req []byte) bool {
		if stmt(SQLText(req)) {
			seen = true
			return false
		}
		return seen && IsCommit(req)
	}
}

// ExecOf matches the execution (the Bind message) that follows the first
// Parse of a statement whose text matches stmt: pgx in
// QueryExecModeDescribeExec sends Parse and Describe in one round trip, then
// Bind and Execute. In autocommit the reply to it comes after the statement
// committed. The predicate keeps state; use a new one for each
// DropReplyOnce.
func ExecOf(stmt func(sql string) bool) func(req []byte) bool {
	seen := false
	return func(req []byte) bool {
		if stmt(SQLText(req)) {
			seen = true
			return false
		}
		return seen && len(req) > 0 && req[0] == 'B'
	}
}
