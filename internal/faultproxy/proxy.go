package faultproxy

import (
	"net"
	"sync"
	"testing"
	"time"
)

// WaitTimeout bounds WaitDropped: far beyond what reaching the armed request
// takes on a loaded machine, so that only a test whose request never came
// reaches it.
const WaitTimeout = 30 * time.Second

// drainTimeout is how long a connection whose client side closed waits for
// the server's side to finish (a reply being swallowed, say) before the
// proxy closes it.
const drainTimeout = 5 * time.Second

// Protocol tells the proxy how to read one wire protocol: where a request
// ends, and when a swallowed reply is whole. RESP and Postgres are the ones
// the project's tests use; a test may define its own.
type Protocol struct {
	// Frame returns the length in bytes of the first whole request at the
	// start of b, or 0 when b holds less than one request (the proxy then
	// reads more). Returning len(b) forwards b as it is. It must not keep b.
	Frame func(b []byte) int
	// ReplyDone reports whether swallowed, every byte the server sent since
	// the matched request was forwarded, holds the whole reply to it; the
	// proxy then closes the connection. Until then it keeps reading (and
	// swallowing) what the server sends.
	ReplyDone func(swallowed []byte) bool
}

// Proxy is a TCP proxy in front of one server address that can lose one
// reply (see the package documentation). Its methods are safe for
// concurrent use.
type Proxy struct {
	t     testing.TB
	ln    net.Listener
	proto Protocol
	// target is the server's address (host:port), dialled for each client
	// connection.
	target string

	mu      sync.Mutex
	match   func(req []byte) bool // armed predicate; nil when disarmed
	dropped int
	// droppedCh is closed, and replaced, each time a reply is swallowed.
	droppedCh chan struct{}
	conns     map[net.Conn]struct{}
	wg        sync.WaitGroup
}

// New starts a Proxy listening on 127.0.0.1 (a free port) that forwards
// every connection to target (host:port) using proto, and closes it, with
// every connection through it, when t's test ends. It fails t when it
// cannot listen; a connection whose dial to target fails is closed.
func New(t testing.TB, target string, proto Protocol) *Proxy {
	t.Helper()
	if proto.Frame == nil || proto.ReplyDone == nil {
		t.Fatal("faultproxy.New: Protocol.Frame and Protocol.ReplyDone are required")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy.New: %v", err)
	}
	p := &Proxy{t: t, ln: ln, target: target, proto: proto, droppedCh: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the address (host:port, on 127.0.0.1) clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DropReplyOnce arms the proxy: the reply to the next request for which
// match returns true is swallowed and its connection closed, and the proxy
// disarms. match runs on every whole request, from the connections'
// goroutines (one call at a time), until one matches; a predicate that
// keeps state across calls (CommitAfter, ExecOf) may rely on that. Arming
// again replaces a predicate that has not matched yet.
func (p *Proxy) DropReplyOnce(match func(req []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.match = match
}

// Dropped is how many replies the proxy has swallowed so far (a reply
// counts once the Protocol's ReplyDone accepted it).
func (p *Proxy) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// WaitDropped waits until at least n replies were swallowed, failing the
// proxy's test (the t given to New) after WaitTimeout. It waits on the
// drops themselves, not by polling a clock.
func (p *Proxy) WaitDropped(n int) {
	p.t.Helper()
	deadline := time.NewTimer(WaitTimeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		got, ch := p.dropped, p.droppedCh
		p.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			p.t.Fatalf("faultproxy: %d replies dropped after %s, want %d (the armed request never came)", got, WaitTimeout, n)
		}
	}
}

// take reports whether req is the armed request, disarming the proxy.
func (p *Proxy) take(req []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.match == nil || !p.match(req) {
		return false
	}
	p.match = nil
	return true
}

// noteDropped counts a swallowed reply and wakes WaitDropped.
func (p *Proxy) noteDropped() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropped++
	close(p.droppedCh)
	p.droppedCh = make(chan struct{})
}

func (p *Proxy) accept() {
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

// close stops accepting, closes every connection and waits for their
// goroutines.
func (p *Proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// serve pumps one client connection to a new server connection and back.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		p.mu.Lock()
		delete(p.conns, client)
		p.mu.Unlock()
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
					if p.proto.ReplyDone(swallowed) {
						p.noteDropped()
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
			k := p.proto.Frame(pending)
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
	case <-time.After(drainTimeout):
	}
}
