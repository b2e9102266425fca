package faultproxy_test

import (
	"encoding/binary"
	"testing"

	"github.com/idemq/idemq/internal/faultproxy"
)

// pgMsg is a typed frontend message: type byte, int32 length, body.
func pgMsg(typ byte, body string) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{typ}, uint32(4+len(body))), body...) //nolint:gosec // test bodies are short
}

func TestFramePG(t *testing.T) {
	t.Parallel()
	startup := []byte{0, 0, 0, 8, 0, 3, 0, 0} // length 8, protocol 3.0
	query := pgMsg('Q', "select 1\x00")
	for _, tc := range []struct {
		name string
		in   []byte
		want int
	}{
		{"empty", nil, 0},
		{"startup", startup, 8},
		{"startup cut", startup[:6], 0},
		{"typed", query, len(query)},
		{"typed, then more", append(append([]byte{}, query...), 'S'), len(query)},
		{"typed cut", query[:len(query)-1], 0},
		{"sync (empty body)", pgMsg('S', ""), 5},
	} {
		if got := faultproxy.FramePG(tc.in); got != tc.want {
			t.Errorf("%s: FramePG = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestPGReplyDone(t *testing.T) {
	t.Parallel()
	complete := pgMsg('C', "COMMIT\x00")
	ready := pgMsg('Z', "I") // ReadyForQuery, idle
	if faultproxy.PGReplyDone(complete) {
		t.Error("CommandComplete alone: done, want not yet")
	}
	if faultproxy.PGReplyDone(append(append([]byte{}, complete...), ready[:5]...)) {
		t.Error("ReadyForQuery without its status byte: done, want not yet")
	}
	if !faultproxy.PGReplyDone(append(append([]byte{}, complete...), ready...)) {
		t.Error("CommandComplete then ReadyForQuery: not done")
	}
}

func TestSQLText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   []byte
		want string
	}{
		{pgMsg('Q', "commit\x00"), "commit"},
		{pgMsg('P', "stmt_1\x00insert into t values ($1)\x00\x00\x00"), "insert into t values ($1)"},
		{pgMsg('P', "\x00select 1\x00\x00\x00"), "select 1"},
		{pgMsg('B', "\x00\x00"), ""},
		{[]byte{'Q'}, ""},
	} {
		if got := faultproxy.SQLText(tc.in); got != tc.want {
			t.Errorf("SQLText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	has := faultproxy.SQLHas("insert into", "values")
	if !has("insert into t values ($1)") || has("insert into t select 1") || faultproxy.SQLHas()("") {
		t.Error("SQLHas: wrong answer")
	}
	if !faultproxy.IsCommit(pgMsg('Q', " COMMIT \x00")) || faultproxy.IsCommit(pgMsg('Q', "rollback\x00")) {
		t.Error("IsCommit: wrong answer")
	}
}

// CommitAfter and ExecOf match the message after the statement, not the
// statement, and only once it was seen.
func TestStatefulMatchers(t *testing.T) {
	t.Parallel()
	claim := faultproxy.SQLHas("insert into", "lease_until")
	parse := pgMsg('P', "\x00insert into r (lease_until) values ($1)\x00\x00\x00")
	other := pgMsg('P', "\x00select 1\x00\x00\x00")
	bind, commit := pgMsg('B', "\x00\x00\x00\x00"), pgMsg('Q', "commit\x00")

	after := faultproxy.CommitAfter(claim)
	for i, step := range []struct {
		req  []byte
		want bool
	}{{commit, false}, {other, false}, {parse, false}, {bind, false}, {commit, true}} {
		if got := after(step.req); got != step.want {
			t.Errorf("CommitAfter step %d: %v, want %v", i, got, step.want)
		}
	}
	exec := faultproxy.ExecOf(claim)
	for i, step := range []struct {
		req  []byte
		want bool
	}{{bind, false}, {parse, false}, {bind, true}} {
		if got := exec(step.req); got != step.want {
			t.Errorf("ExecOf step %d: %v, want %v", i, got, step.want)
		}
	}
	if exec(nil) {
		t.Error("ExecOf(nil) matched")
	}
}
