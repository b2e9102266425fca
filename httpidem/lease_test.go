package httpidem

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
)

// Lease mode: the claim commits first, so a copy that arrives while the
// first runs finds a live lease (409 + Retry-After), and the finished
// request is replayed; the handler has no transaction and passes one
// downstream key.
func TestLeaseModeReplaysAndAnswersInFlight(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Lease = &dedup.LeaseOptions{TTL: 30 * time.Second} })
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	e.before = func(_ *http.Request, attempt int) int {
		if attempt == 1 {
			started <- struct{}{}
			<-release
		}
		return 0
	}
	body := `{"amount":"30.00"}`
	first := make(chan resp, 1)
	go func() { first <- e.post("/charges", "alice", "L1", body) }()
	<-started
	copy1 := e.post("/charges", "alice", "L1", body)
	if copy1.status != http.StatusConflict || copy1.problem(t).Type != TypeInFlight || copy1.header.Get("Retry-After") == "" {
		t.Fatalf("copy during the lease: %d %s", copy1.status, copy1.body)
	}
	status, _ := e.record("alice", "POST /charges", "L1")
	mustEqual(t, "record while the handler runs (committed claim)", status, "PROCESSING")
	close(release)
	a := <-first
	if a.status != http.StatusCreated || a.replayed() {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	b := e.post("/charges", "alice", "L1", body)
	if b.status != http.StatusCreated || !b.replayed() || !bodyEqual(a.body, b.body) {
		t.Fatalf("retry: %d replayed=%v %s", b.status, b.replayed(), b.body)
	}
	if c := e.post("/charges", "alice", "L1", `{"amount":"31.00"}`); c.status != http.StatusUnprocessableEntity {
		t.Fatalf("another body: %d %s", c.status, c.body)
	}
	mustEqual(t, "handler calls", e.calls.Load(), 1)
	status, attempts := e.record("alice", "POST /charges", "L1")
	mustEqual(t, "record", status+"/"+strconv.Itoa(attempts), "SUCCEEDED/1")
}

// Lease mode takeover: an owner that stalls past its lease is taken over by
// the retry, which runs the handler again with the same downstream key (so
// the provider deduplicates); the stale owner's response is refused
// (fenced) and its client told to retry; replays return the new owner's
// response.
func TestLeaseModeTakeoverFencesTheStaleOwner(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Lease = &dedup.LeaseOptions{TTL: time.Second, DisableHeartbeat: true} })
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	// A failed check below still lets the stale owner's handler return, so
	// the server's shutdown (registered earlier, run later) cannot hang.
	t.Cleanup(unblock)
	started := make(chan struct{}, 1)
	e.before = func(_ *http.Request, attempt int) int {
		if attempt == 1 {
			started <- struct{}{}
			<-release
		}
		return 0
	}
	body := `{"amount":"30.00"}`
	stale := make(chan resp, 1)
	go func() { stale <- e.post("/charges", "alice", "L2", body) }()
	<-started
	var second resp
	deadline := time.Now().Add(time.Minute)
	for {
		second = e.post("/charges", "alice", "L2", body)
		if second.status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the lease (1s, database time) has not expired yet
	}
	if second.status != http.StatusCreated || second.replayed() {
		t.Fatalf("takeover: %d %s", second.status, second.body)
	}
	unblock()
	s := <-stale
	if s.status != http.StatusConflict {
		t.Fatalf("stale owner's answer: %d %s, want 409 (fenced)", s.status, s.body)
	}
	r := e.post("/charges", "alice", "L2", body)
	if !r.replayed() || !bodyEqual(r.body, second.body) {
		t.Fatalf("replay: %d %s, want %s", r.status, r.body, second.body)
	}
	e.providerMu.Lock()
	defer e.providerMu.Unlock()
	if len(e.provider) != 1 {
		t.Fatalf("downstream keys %v: both owners must send the same one", e.provider)
	}
	status, attempts := e.record("alice", "POST /charges", "L2")
	mustEqual(t, "record", status+"/"+strconv.Itoa(attempts), "SUCCEEDED/2")

	// A stale owner's late write of its response is refused by token and
	// fence, whatever its context still allows.
	id := dedup.Identity{Scope: Scope(e.tenant, "alice", http.MethodPost, "POST /charges"), MessageID: "L2"}
	var token uuid.UUID
	if err := dbPool.QueryRow(e.ctx, `select owner_token from `+quoted(dbSchema, "consumption_records")+` where scope = $1 and message_id = 'L2'`, id.Scope).Scan(&token); err != nil {
		t.Fatal(err)
	}
	for _, l := range []dedup.Lease{{Identity: id, OwnerToken: uuid.New(), Fence: 1}, {Identity: id, OwnerToken: token, Fence: 0}} {
		err := e.mw.hs.StoreLeased(e.ctx, l, "x", CanonicalVersion, true, pgstore.HTTPResponse{Status: 500, Stored: []byte("stale")})
		if !errors.Is(err, dedup.ErrFenced) {
			t.Fatalf("stale write %+v: %v, want ErrFenced", l, err)
		}
	}
	if r := e.post("/charges", "alice", "L2", body); !bodyEqual(r.body, second.body) {
		t.Fatalf("replay after the stale writes: %s", r.body)
	}
}

// Lease mode failures leave the key retryable and count against the cap.
func TestLeaseModeFailureAndCap(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Lease = &dedup.LeaseOptions{TTL: 30 * time.Second}; c.MaxUnfinished = 1 })
	e.before = func(_ *http.Request, attempt int) int {
		if attempt == 1 {
			return http.StatusBadGateway
		}
		return 0
	}
	if r := e.post("/charges", "alice", "L3", `{}`); r.status != http.StatusBadGateway {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if r := e.post("/charges", "alice", "L4", `{}`); r.status != http.StatusTooManyRequests {
		t.Fatalf("a new key past the cap: %d %s", r.status, r.body)
	}
	if r := e.post("/charges", "alice", "L3", `{}`); r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	if r := e.post("/charges", "alice", "L4", `{}`); r.status != http.StatusBadGateway {
		t.Fatalf("a new key once L3 finished: %d %s", r.status, r.body)
	}
}
