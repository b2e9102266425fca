package faultproxy_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/faultproxy"
)

// lines is a line protocol for the tests: a request ends at '\n', and so
// does a reply.
var lines = faultproxy.Protocol{
	Frame: func(b []byte) int {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			return i + 1
		}
		return 0
	},
	ReplyDone: func(swallowed []byte) bool { return bytes.IndexByte(swallowed, '\n') >= 0 },
}

// echoServer answers each line with the same line, after recording it: a
// recorded line is work the server did, whether or not its reply arrived.
type echoServer struct {
	ln   net.Listener
	mu   sync.Mutex
	seen []string
	wg   sync.WaitGroup
}

func newEchoServer(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go s.serve(c)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); s.wg.Wait() })
	return s
}

func (s *echoServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() { _ = c.Close() }()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		s.mu.Lock()
		s.seen = append(s.seen, line)
		s.mu.Unlock()
		if _, err := c.Write([]byte(line)); err != nil {
			return
		}
	}
}

func (s *echoServer) received() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

func (s *echoServer) addr() string { return s.ln.Addr().String() }

// client is one connection through the proxy, with a deadline far beyond
// any round trip so that a hung proxy fails the test instead of hanging it.
type client struct {
	t testing.TB
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.SetDeadline(time.Now().Add(faultproxy.WaitTimeout)); err != nil {
		t.Fatal(err)
	}
	return &client{t: t, c: c, r: bufio.NewReader(c)}
}

func (c *client) send(s string) {
	c.t.Helper()
	if _, err := c.c.Write([]byte(s)); err != nil {
		c.t.Fatalf("write %q: %v", s, err)
	}
}

// roundTrip sends line and returns the reply line.
func (c *client) roundTrip(line string) string {
	c.t.Helper()
	c.send(line)
	got, err := c.r.ReadString('\n')
	if err != nil {
		c.t.Fatalf("reply to %q: %q, %v", line, got, err)
	}
	return got
}

// Every byte goes through unchanged, both ways, on several connections at
// once, including a request larger than the proxy's read buffer; nothing is
// dropped while the proxy is not armed.
func TestPassThrough(t *testing.T) {
	t.Parallel()
	srv := newEchoServer(t)
	p := faultproxy.New(t, srv.addr(), lines)
	big := strings.Repeat("x", 200<<10) + "\n"
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			c := dial(t, p.Addr())
			for _, line := range []string{"a\n", big, strconv.Itoa(i) + "\n"} {
				if got := c.roundTrip(line); got != line {
					t.Errorf("conn %d: reply of %d bytes, want the %d sent", i, len(got), len(line))
				}
			}
		})
	}
	wg.Wait()
	if n := p.Dropped(); n != 0 {
		t.Fatalf("Dropped = %d, want 0", n)
	}
	if n := len(srv.received()); n != 12 {
		t.Fatalf("the server received %d requests, want 12", n)
	}
}

// The armed request reaches the server, which runs it; its reply is
// swallowed and the client's connection closed, with not one byte of the
// reply delivered. The proxy then disarms: a retry on a new connection
// passes through.
func TestDropReplyOnce(t *testing.T) {
	t.Parallel()
	srv := newEchoServer(t)
	p := faultproxy.New(t, srv.addr(), lines)
	c := dial(t, p.Addr())
	if got := c.roundTrip("before\n"); got != "before\n" {
		t.Fatalf("reply = %q", got)
	}

	p.DropReplyOnce(func(req []byte) bool { return string(req) == "pay\n" })
	c.send("pay\n")
	got, err := io.ReadAll(c.r)
	if len(got) != 0 || err != nil { // ReadAll: nil at EOF
		t.Fatalf("after the armed request the client read %q, %v; want EOF and no byte of the reply", got, err)
	}
	p.WaitDropped(1)
	if n := p.Dropped(); n != 1 {
		t.Fatalf("Dropped = %d, want 1", n)
	}
	if seen := srv.received(); len(seen) != 2 || seen[1] != "pay\n" {
		t.Fatalf("the server received %q; want the armed request to have reached it", seen)
	}

	retry := dial(t, p.Addr())
	if got := retry.roundTrip("pay\n"); got != "pay\n" {
		t.Fatalf("retry: reply %q, want it passed through (the proxy disarmed)", got)
	}
	if n := p.Dropped(); n != 1 {
		t.Fatalf("Dropped after the retry = %d, want still 1", n)
	}
}

// Requests that do not match pass through, on every connection, until one
// matches; arming again replaces a predicate that has not matched.
func TestDropReplyOnceWaitsForAMatch(t *testing.T) {
	t.Parallel()
	srv := newEchoServer(t)
	p := faultproxy.New(t, srv.addr(), lines)
	p.DropReplyOnce(func(req []byte) bool { return string(req) == "never\n" })
	p.DropReplyOnce(func(req []byte) bool { return string(req) == "third\n" })
	a, b := dial(t, p.Addr()), dial(t, p.Addr())
	for _, line := range []string{"first\n", "never\n"} {
		if got := a.roundTrip(line); got != line {
			t.Fatalf("reply = %q, want %q", got, line)
		}
	}
	b.send("third\n")
	if got, err := io.ReadAll(b.r); len(got) != 0 || err != nil {
		t.Fatalf("read %q, %v; want EOF", got, err)
	}
	p.WaitDropped(1)
	if got := a.roundTrip("fourth\n"); got != "fourth\n" {
		t.Fatalf("the other connection: reply %q, want it untouched", got)
	}
}

// A predicate sees whole requests however the client's bytes arrive: here
// written a byte at a time, and two requests in one write.
func TestPredicateSeesWholeRequests(t *testing.T) {
	t.Parallel()
	srv := newEchoServer(t)
	p := faultproxy.New(t, srv.addr(), lines)
	var mu sync.Mutex
	var seen []string
	p.DropReplyOnce(func(req []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, string(req))
		return false
	})
	c := dial(t, p.Addr())
	for _, b := range []byte("hello\n") {
		c.send(string(b))
	}
	if got, err := c.r.ReadString('\n'); got != "hello\n" || err != nil {
		t.Fatalf("reply = %q, %v", got, err)
	}
	c.send("one\ntwo\n")
	for _, want := range []string{"one\n", "two\n"} {
		if got, err := c.r.ReadString('\n'); got != want || err != nil {
			t.Fatalf("reply = %q, %v; want %q", got, err, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"hello\n", "one\n", "two\n"}; strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Fatalf("the predicate saw %q, want %q", seen, want)
	}
}

// When the proxy cannot reach its target, the client's connection is
// closed (the client sees the server as down).
func TestTargetDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	_ = ln.Close()
	p := faultproxy.New(t, down, lines)
	c := dial(t, p.Addr())
	if got, err := io.ReadAll(c.r); len(got) != 0 || err != nil {
		t.Fatalf("read %q, %v; want EOF", got, err)
	}
}

// The proxy closes, with its connections, when the test that made it ends.
func TestClosedAtTestEnd(t *testing.T) {
	t.Parallel()
	srv := newEchoServer(t)
	var addr string
	var c *client
	t.Run("owner", func(st *testing.T) {
		p := faultproxy.New(st, srv.addr(), lines) // closed when the subtest ends
		addr = p.Addr()
		c = dial(t, addr) // the parent's: the client side stays open
		if got := c.roundTrip("x\n"); got != "x\n" {
			st.Fatalf("reply = %q", got)
		}
	})
	if got, err := c.r.ReadString('\n'); err == nil {
		t.Fatalf("read %q from a connection of a closed proxy, want an error", got)
	}
	if conn, err := net.Dial("tcp", addr); err == nil {
		_ = conn.Close()
		t.Fatal("the proxy still accepts connections after its test ended")
	}
}
