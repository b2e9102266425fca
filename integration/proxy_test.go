package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// faultProxy is a TCP proxy in front of a real server (Redis or Postgres)
// that can lose one reply. Armed with a predicate, it forwards the next
// client request that matches, lets the server run it and answer, then
// swallows that answer and closes the client's connection: the client sees
// its connection die after sending the request, so the outcome is unknown
// to it, although the server did the work. go-redis then retries the
// command on a new connection; our own retry loops do the same.
//
// Requests are cut out of the client's byte stream by frame (frameRESP,
// framePG), so a predicate sees one whole request; replyDone says when the
// swallowed bytes hold the whole answer (Redis: the first bytes, as a
// script's reply is written after it ran; Postgres: ReadyForQuery, which
// comes after the statement committed).
type faultProxy struct {
	t         testing.TB
	ln        net.Listener
	target    string
	frame     func(b []byte) int
	replyDone func(swallowed []byte) bool

	mu      sync.Mutex
	match   func(req []byte) bool
	dropped int
	seen    []string // the requests whose replies were dropped, for messages
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// newFaultProxy listens on 127.0.0.1:0 and forwards every connection to
// target until the test ends.
func newFaultProxy(t testing.TB, target string, frame func([]byte) int, replyDone func([]byte) bool) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{t: t, ln: ln, target: target, frame: frame, replyDone: replyDone, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// newRedisProxy is a faultProxy in front of the test Redis.
func newRedisProxy(t testing.TB) *faultProxy {
	return newFaultProxy(t, redisAddress(t), frameRESP, func([]byte) bool { return true })
}

// newPGProxy is a faultProxy in front of the test Postgres, with a pool of
// maxConns connections that reach Postgres through it. The pool parses every
// statement anew (pgx.QueryExecModeDescribeExec) so that its text is on the
// wire for the proxy's predicates each time, not only the first time on a
// connection.
func newPGProxy(t testing.TB, maxConns int32) (*faultProxy, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	p := newFaultProxy(t, target, framePG, pgReplyDone)
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(n), nil
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeDescribeExec
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return p, pool
}

// Addr is the proxy's address (host:port).
func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

// DropReplyOnce arms the proxy: the reply to the next request for which
// match returns true is lost and its connection closed. match runs on every
// request until one matches, from the connections' goroutines.
func (p *faultProxy) DropReplyOnce(match func(req []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.match = match
}

// Dropped is how many replies the proxy has swallowed.
func (p *faultProxy) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// WaitDropped waits until n replies were swallowed, failing the test after
// a generous deadline.
func (p *faultProxy) WaitDropped(n int) {
	p.t.Helper()
	eventually(p.t, 30*time.Second, "the proxy to drop "+strconv.Itoa(n)+" replies (the armed request)", func() bool { return p.Dropped() >= n })
}

// take reports whether req is the armed request, disarming the proxy.
func (p *faultProxy) take(req []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.match == nil || !p.match(req) {
		return false
	}
	p.match = nil
	p.seen = append(p.seen, string(req))
	return true
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *faultProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// serve pumps one client connection to a new server connection and back.
func (p *faultProxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	p.mu.Lock()
	p.conns[server] = struct{}{}
	p.mu.Unlock()
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			_ = client.Close()
			_ = server.Close()
			p.mu.Lock()
			delete(p.conns, client)
			delete(p.conns, server)
			p.mu.Unlock()
		})
	}
	defer closeBoth()

	var dropMu sync.Mutex
	drop := false // the reply now coming from the server is to be swallowed
	replies := make(chan struct{})
	go func() { // server → client
		defer close(replies)
		defer closeBoth()
		buf := make([]byte, 64<<10)
		var swallowed []byte
		for {
			n, err := server.Read(buf)
			if n > 0 {
				dropMu.Lock()
				d := drop
				dropMu.Unlock()
				if d {
					swallowed = append(swallowed, buf[:n]...)
					if p.replyDone(swallowed) {
						p.mu.Lock()
						p.dropped++
						p.mu.Unlock()
						return // closeBoth: the client never sees the reply
					}
					continue
				}
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()

	buf := make([]byte, 64<<10)
	var pending []byte
	for {
		n, err := client.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			k := p.frame(pending)
			if k == 0 {
				break
			}
			req := pending[:k]
			if p.take(req) {
				dropMu.Lock()
				drop = true
				dropMu.Unlock()
			}
			if _, werr := server.Write(req); werr != nil {
				closeBoth()
				<-replies
				return
			}
			pending = pending[k:]
		}
		if err != nil {
			break
		}
	}
	// The client closed (or was closed): let the server's answer, if one is
	// being swallowed, finish first.
	if len(pending) > 0 {
		_, _ = server.Write(pending)
	}
	select {
	case <-replies:
	case <-time.After(5 * time.Second):
	}
}

// frameRESP returns the length of the first whole RESP command in b ("*N"
// then N bulk strings, as go-redis writes them), 0 if b holds less. Bytes
// that are not a RESP array go through as they are.
func frameRESP(b []byte) int {
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

// respArgs splits one whole RESP command into its arguments (nil if req is
// not one).
func respArgs(req []byte) []string {
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

// scriptCall is a script run seen on the wire: EVALSHA or EVAL with its keys
// and arguments.
type scriptCall struct {
	keys, argv []string
}

// asScript parses req as EVALSHA/EVAL; ok is false for any other command.
func asScript(req []byte) (c scriptCall, ok bool) {
	args := respArgs(req)
	if len(args) < 3 || (!strings.EqualFold(args[0], "evalsha") && !strings.EqualFold(args[0], "eval")) {
		return c, false
	}
	n, err := strconv.Atoi(args[2])
	if err != nil || len(args) < 3+n {
		return c, false
	}
	return scriptCall{keys: args[3 : 3+n], argv: args[3+n:]}, true
}

// key reports whether one of the call's keys contains part.
func (c scriptCall) key(part string) bool {
	for _, k := range c.keys {
		if strings.Contains(k, part) {
			return true
		}
	}
	return false
}

// arg returns ARGV[i] (1-based, as in the script), "" when absent.
func (c scriptCall) arg(i int) string {
	if i < 1 || i > len(c.argv) {
		return ""
	}
	return c.argv[i-1]
}

// framePG returns the length of the first whole Postgres frontend message
// in b: the startup message (no type byte; its length's first byte is 0)
// or a typed message (type byte, then its length), 0 if b holds less.
func framePG(b []byte) int {
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

// pgReplyDone reports whether swallowed holds a ReadyForQuery message
// ('Z', length 5, status): the statement before it has finished, and in
// autocommit committed.
func pgReplyDone(swallowed []byte) bool {
	i := bytes.Index(swallowed, []byte{'Z', 0, 0, 0, 5})
	return i >= 0 && len(swallowed) > i+5
}

// pgSQL returns the SQL text of a Query message ('Q', simple protocol) or a
// Parse message ('P', extended protocol), "" for any other message.
func pgSQL(req []byte) string {
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
