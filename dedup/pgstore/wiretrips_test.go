package pgstore

// The round-trip counter of roundtrip_test.go, fed scripted byte streams:
// it counts protocol round trips (the client waiting for the server), not
// Read calls, whatever the reads look like.

import (
	"encoding/binary"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// scriptConn is a net.Conn whose Read returns the chunks sent on replies,
// one per call, and whose Write discards.
type scriptConn struct {
	net.Conn // nil: only Read and Write are used
	replies  chan []byte
}

func (c *scriptConn) Read(b []byte) (int, error) {
	r, ok := <-c.replies
	if !ok {
		return 0, errors.New("script ended")
	}
	if len(r) > len(b) {
		panic("scripted chunk larger than the read buffer")
	}
	return copy(b, r), nil
}

func (c *scriptConn) Write(b []byte) (int, error) { return len(b), nil }

// pgMsg is one protocol message: a type byte (0: the untyped wireStartup
// message) and a body.
func pgMsg(typ byte, body ...byte) []byte {
	var b []byte
	if typ != 0 {
		b = append(b, typ)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(body))) //nolint:gosec // scripted messages are a few bytes long
	return append(b, body...)
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

var (
	wireStartup  = pgMsg(0, 0, 3, 0, 0, 'u', 's', 'e', 'r', 0, 'x', 0, 0)
	wireAuthOK   = pgMsg('R', 0, 0, 0, 0)
	wireAuthSASL = pgMsg('R', cat([]byte{0, 0, 0, 10}, []byte("SCRAM-SHA-256\x00\x00"))...)
	wireSaslCont = pgMsg('R', 0, 0, 0, 11, 'r', '=')
	wireSaslFin  = pgMsg('R', 0, 0, 0, 12, 'v', '=')
	wirePassword = pgMsg('p', 'x')
	wireReady    = pgMsg('Z', 'I')
	wireInTx     = pgMsg('Z', 'T')
	wireQuery    = pgMsg('Q', 's', 'e', 'l', 'e', 'c', 't', ' ', '1', 0)
	wireParse    = pgMsg('P', 0, 's', 0, 0, 0)
	wireBind     = pgMsg('B', 0, 0, 0, 0, 0, 0, 0, 0)
	wireExecute  = pgMsg('E', 0, 0, 0, 0, 0)
	wireSync     = pgMsg('S')
	wireParsed   = pgMsg('1')
	wireBound    = pgMsg('2')
	wireDone     = pgMsg('C', 'B', 'E', 'G', 'I', 'N', 0)
	wireCopyIn   = pgMsg('G', 0, 0, 0)
	wireCopyData = pgMsg('d', 'a', '\n')
	wireCopyDone = pgMsg('c')
)

// step is the client writing w (if any), then reading the scripted chunks
// r (one Read each). early: the read of the first chunk begins before the
// write, as pgconn's background reader's does when a write is slow.
type step struct {
	w     []byte
	r     [][]byte
	early bool
}

// countTrips plays steps through the counting wrapper and returns the
// round trips it counted.
func countTrips(t *testing.T, steps []step) int64 {
	t.Helper()
	sc := &scriptConn{replies: make(chan []byte)}
	var trips atomic.Int64
	conn := wrapTrips(sc, &trips)
	buf := make([]byte, 8192)
	for i, s := range steps {
		r := s.r
		if s.early && len(r) > 0 {
			began := make(chan struct{})
			got := make(chan error, 1)
			go func() {
				close(began)
				_, err := conn.Read(buf)
				got <- err
			}()
			<-began
			// The reader is inside Read (or about to enter it): give it
			// the first chunk only after the write, in any case.
			if _, err := conn.Write(s.w); err != nil {
				t.Fatal(err)
			}
			select {
			case sc.replies <- r[0]:
			case <-time.After(10 * time.Second):
				t.Fatalf("step %d: the early read never asked for its chunk", i)
			}
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			r = r[1:]
		} else if s.w != nil {
			if _, err := conn.Write(s.w); err != nil {
				t.Fatal(err)
			}
		}
		for _, chunk := range r {
			go func() { sc.replies <- chunk }()
			if _, err := conn.Read(buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	return trips.Load()
}

func TestTripCounterCountsProtocolRoundTrips(t *testing.T) {
	login := []step{
		{w: wireStartup, r: [][]byte{wireAuthSASL}},
		{w: wirePassword, r: [][]byte{wireSaslCont}},
		{w: wirePassword, r: [][]byte{cat(wireSaslFin, wireAuthOK, wireReady)}},
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  int64
	}{
		{"two queries", []step{
			{w: wireQuery, r: [][]byte{cat(wireDone, wireReady)}},
			{w: wireQuery, r: [][]byte{cat(wireDone, wireReady)}},
		}, 2},
		// pgconn's background reader begins its Read while the write is
		// still on its way: that read's answer is still one round trip.
		{"a read begun before the write", []step{
			{w: wireQuery, r: [][]byte{cat(wireDone, wireReady)}},
			{w: wireQuery, r: [][]byte{cat(wireDone, wireReady)}, early: true},
			{w: wireQuery, r: [][]byte{cat(wireDone, wireReady)}},
		}, 3},
		{"reads begun before every other write", []step{
			{w: wireQuery, r: [][]byte{cat(wireDone, wireReady)}, early: true},
			{w: wireQuery, r: [][]byte{cat(wireDone, wireReady)}},
			{w: wireQuery, r: [][]byte{cat(wireDone, wireReady)}, early: true},
			{w: wireQuery, r: [][]byte{cat(wireDone, wireReady)}},
		}, 4},
		// A pipeline (two Syncs in one write) waits once, however its
		// answers are cut into reads.
		{"a pipeline answered in one read", []step{
			{w: cat(wireParse, wireBind, wireExecute, wireSync, wireBind, wireExecute, wireSync), r: [][]byte{cat(wireParsed, wireBound, wireDone, wireInTx, wireBound, wireDone, wireInTx)}},
		}, 1},
		{"an answer split across reads, mid-message", []step{
			{w: cat(wireBind, wireExecute, wireSync), r: [][]byte{cat(wireBound, wireDone[:3]), cat(wireDone[3:], wireInTx[:2]), wireInTx[2:]}},
			{w: wireQuery, r: [][]byte{cat(wireDone, wireReady)}},
		}, 2},
		// COPY FROM STDIN: the client waits for CopyInResponse, then for
		// the answer to its data.
		{"copy from stdin", []step{
			{w: wireQuery, r: [][]byte{wireCopyIn}},
			{w: cat(wireCopyData, wireCopyDone), r: [][]byte{cat(wireDone, wireReady)}},
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every script logs in first: the startup message and two
			// SASL answers, each awaited.
			if got := countTrips(t, append(login[:3:3], tc.steps...)); got != 3+tc.want {
				t.Errorf("%d round trips counted after the login's 3, want %d", got-3, tc.want)
			}
		})
	}
}
