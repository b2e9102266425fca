package faultproxy_test

import (
	"slices"
	"strconv"
	"testing"

	"github.com/idemq/idemq/internal/faultproxy"
)

// resp encodes args as go-redis writes a command.
func resp(args ...string) string {
	s := "*" + itoa(len(args)) + "\r\n"
	for _, a := range args {
		s += "$" + itoa(len(a)) + "\r\n" + a + "\r\n"
	}
	return s
}

func itoa(n int) string { return strconv.Itoa(n) }
func TestFrameRESP(t *testing.T) {
	t.Parallel()
	set := resp("SET", "k", "a\r\nvalue with CRLF")
	for _, tc := range []struct {
		name string
		in   string
		want int
	}{
		{"empty", "", 0},
		{"whole", set, len(set)},
		{"two, the first cut", set + resp("GET", "k"), len(set)},
		{"cut in a length line", set[:2], 0},
		{"cut in a bulk string", set[:len(set)-3], 0},
		{"cut before the final CRLF", set[:len(set)-1], 0},
		{"inline command passes through", "PING\r\n", len("PING\r\n")},
		{"bad count waits", "*x\r\n", 0},
	} {
		if got := faultproxy.FrameRESP([]byte(tc.in)); got != tc.want {
			t.Errorf("%s: FrameRESP = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestRESPArgs(t *testing.T) {
	t.Parallel()
	if got := faultproxy.RESPArgs([]byte(resp("SET", "pre:m:m-1", "v"))); !slices.Equal(got, []string{"SET", "pre:m:m-1", "v"}) {
		t.Errorf("RESPArgs = %q", got)
	}
	for _, bad := range []string{"", "PING\r\n", "*3\r\n$3\r\nSET\r\n"} {
		if got := faultproxy.RESPArgs([]byte(bad)); got != nil {
			t.Errorf("RESPArgs(%q) = %q, want nil", bad, got)
		}
	}
}

func TestAsScript(t *testing.T) {
	t.Parallel()
	sc, ok := faultproxy.AsScript([]byte(resp("evalsha", "abc123", "2", "p:{s}:lease:m-1", "p:{s}:rec:m-1", "tok", "7")))
	if !ok || !slices.Equal(sc.Keys, []string{"p:{s}:lease:m-1", "p:{s}:rec:m-1"}) || !slices.Equal(sc.Argv, []string{"tok", "7"}) {
		t.Fatalf("AsScript = %+v, %v", sc, ok)
	}
	if !sc.HasKey(":lease:") || sc.HasKey(":conflict:") {
		t.Errorf("HasKey: lease %v, conflict %v; want true, false", sc.HasKey(":lease:"), sc.HasKey(":conflict:"))
	}
	if sc.Arg(1) != "tok" || sc.Arg(2) != "7" || sc.Arg(0) != "" || sc.Arg(3) != "" {
		t.Errorf("Arg(1..3, 0) = %q %q %q %q", sc.Arg(1), sc.Arg(2), sc.Arg(3), sc.Arg(0))
	}
	if _, ok := faultproxy.AsScript([]byte(resp("EVAL", "return 1", "0"))); !ok {
		t.Error("EVAL with no keys: not a script")
	}
	for _, other := range []string{resp("SET", "k", "v"), resp("EVALSHA", "abc", "3", "k1"), resp("EVALSHA", "abc", "-1")} {
		if sc, ok := faultproxy.AsScript([]byte(other)); ok {
			t.Errorf("AsScript(%q) = %+v, want not a script", other, sc)
		}
	}
}
