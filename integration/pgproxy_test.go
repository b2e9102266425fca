package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pgProxy is a TCP proxy in front of the test Postgres that can lose the
// server's reply to one request: armed with a pattern, it forwards the
// first client message holding it (a simple-protocol 'Q', or the extended
// protocol's Parse/Bind… up to the Sync after an Execute), lets the server
// run it to the end, then drops the server's reply and closes both sides.
// The request took effect (a COMMIT committed), but the client sees a lost
// connection: an outcome unknown.
type pgProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	pattern []byte // armed when not nil
	fired   atomic.Int32
}

// newPGProxy starts a proxy to the test Postgres and returns it with a pool
// of its own that connects through it (MaxConns conns).
func newPGProxy(t testing.TB, maxConns int32) (*pgProxy, *pgxpool.Pool) {
	t.Helper()
	dsn := postgresDSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("the proxy needs a URL DSN (postgres://…): %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{ln: ln, target: u.Host}
	go p.accept()
	t.Cleanup(func() { _ = ln.Close() })
	u.Host = ln.Addr().String()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = "idemq-test-proxy"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return p, pool
}

// loseReplyTo arms the proxy: the next request holding pattern has its
// reply lost.
func (p *pgProxy) loseReplyTo(pattern string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pattern = []byte(pattern)
}

func (p *pgProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *pgProxy) serve(client net.Conn) {
	server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	var drop atomic.Bool // set just before the request whose reply is lost goes out
	closeBoth := func() { _ = client.Close(); _ = server.Close() }
	go func() { // server → client
		defer closeBoth()
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && drop.Load() {
				// The server answered: the request ran to its end. Lose
				// the answer.
				p.fired.Add(1)
				return
			}
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	// client → server, message by message. The startup message has no
	// type byte; sslmode=disable sends no SSLRequest.
	defer closeBoth()
	var hdr [4]byte
	if _, err := io.ReadFull(client, hdr[:]); err != nil {
		return
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:])-4)
	if _, err := io.ReadFull(client, body); err != nil {
		return
	}
	if _, err := server.Write(append(hdr[:], body...)); err != nil {
		return
	}
	matched, executed := false, false
	for {
		var h [5]byte
		if _, err := io.ReadFull(client, h[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(h[1:])-4)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		if !matched {
			p.mu.Lock()
			if p.pattern != nil && bytes.Contains(body, p.pattern) {
				matched, p.pattern = true, nil
			}
			p.mu.Unlock()
		}
		if matched {
			switch h[0] {
			case 'Q':
				drop.Store(true)
			case 'E':
				executed = true
			case 'S':
				if executed {
					drop.Store(true)
				}
			}
		}
		if _, err := server.Write(append(h[:], body...)); err != nil {
			return
		}
	}
}
