package faultproxy

import (
	"bytes"
	"strconv"
	"strings"
)

// RESP is the Redis protocol as go-redis writes it: a request is one RESP
// array of bulk strings (FrameRESP), and a swallowed reply counts as whole
// from its first bytes, since Redis writes a command's reply (a script's
// included) only after the command ran.
var RESP = Protocol{Frame: FrameRESP, ReplyDone: func([]byte) bool { return true }}

// FrameRESP returns the length of the first whole RESP command at the start
// of b ("*N\r\n" then N bulk strings "$len\r\ndata\r\n", as go-redis writes
// them), 0 if b holds less. Bytes that do not start a RESP array (inline
// commands) go through as they are: it returns len(b).
func FrameRESP(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	if b[0] != '*' {
		return len(b)
	}
	line := func(at int) (int, int, bool) { // the integer after b[at]'s type byte, and where the next line starts
		end := bytes.Index(b[at:], []byte("\r\n"))
		if end < 0 {
			return 0, 0, false
		}
		n, err := strconv.Atoi(string(b[at+1 : at+end]))
		if err != nil {
			return 0, 0, false
		}
		return n, at + end + 2, true
	}
	n, at, ok := line(0)
	if !ok {
		return 0
	}
	for range n {
		if at >= len(b) {
			return 0
		}
		size, next, ok := line(at)
		if !ok {
			return 0
		}
		at = next + size + 2
		if at > len(b) {
			return 0
		}
	}
	return at
}

// RESPArgs splits one whole RESP command (as FrameRESP cuts it) into its
// arguments, the command name first; nil if req is not a RESP array.
func RESPArgs(req []byte) []string {
	if len(req) == 0 || req[0] != '*' {
		return nil
	}
	parts := strings.Split(string(req), "\r\n")
	n, err := strconv.Atoi(parts[0][1:])
	if err != nil || len(parts) < 1+2*n {
		return nil
	}
	args := make([]string, 0, n)
	for i := range n {
		args = append(args, parts[2+2*i])
	}
	return args
}

// Script is a Lua script run seen on the wire: EVALSHA or EVAL with its
// keys (KEYS) and arguments (ARGV).
type Script struct {
	Keys, Argv []string
}

// AsScript parses req, one whole RESP command, as EVALSHA or EVAL (any
// case); ok is false for any other command or a malformed one.
func AsScript(req []byte) (s Script, ok bool) {
	args := RESPArgs(req)
	if len(args) < 3 || (!strings.EqualFold(args[0], "evalsha") && !strings.EqualFold(args[0], "eval")) {
		return s, false
	}
	n, err := strconv.Atoi(args[2])
	if err != nil || n < 0 || len(args) < 3+n {
		return s, false
	}
	return Script{Keys: args[3 : 3+n], Argv: args[3+n:]}, true
}

// HasKey reports whether one of the script's keys contains part.
func (s Script) HasKey(part string) bool {
	for _, k := range s.Keys {
		if strings.Contains(k, part) {
			return true
		}
	}
	return false
}

// Arg returns ARGV[i], 1-based as in the script, or "" when absent.
func (s Script) Arg(i int) string {
	if i < 1 || i > len(s.Argv) {
		return ""
	}
	return s.Argv[i-1]
}
