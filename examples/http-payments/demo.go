package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/httpidem"
	"github.com/idemq/idemq/internal/devenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The story's requests: each step has its own payment reference (ref) and
// Idempotency-Key, so the database tells what each step did.
const (
	user         = "alice"
	keyGateway   = "K-gateway"
	keyAmount    = "K-amount"
	keyMany      = "K-concurrent"
	keyCrash     = "K-crash"
	copies       = 20
	gatewayLimit = 500 * time.Millisecond // the gateway's timeout
	providerTime = 1500 * time.Millisecond
)

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	dsn := fs.String("dsn", devenv.PostgresDSN(), "Postgres DSN")
	redisAt := fs.String("redis", redisAddr(), "Redis address")
	_ = fs.Parse(args)

	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	schema := "http_payments_demo_" + run
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := createSchema(ctx, pool, schema); err != nil {
		return fmt.Errorf("postgres at %s: %w (start the services with `make services-up`)", *dsn, err)
	}
	fmt.Printf("schema %s: idemq's tables, and orders ord-1 (PENDING) and ord-2 (CANCELLED) on each side\n", schema)
	stories := map[string]*story{}
	for _, mode := range []string{"idemq", "naive"} {
		st := &story{mode: mode, schema: schema, dsn: *dsn, redis: *redisAt}
		stories[mode] = st
		if err := st.play(ctx); err != nil {
			return fmt.Errorf("%s server: %w", mode, err)
		}
	}
	return summarize(ctx, pool, schema, stories)
}

// answer is what a client saw.
type answer struct {
	status    int
	replayed  bool
	paymentID string // Resource-Id
	body      string
	err       error // transport error (timeout, connection reset)
}

func (a answer) String() string {
	if a.err != nil {
		return "no answer (" + shortErr(a.err) + ")"
	}
	s := strconv.Itoa(a.status)
	if a.paymentID != "" {
		s += " " + a.paymentID
	}
	if a.replayed {
		s += " (replay)"
	}
	return s
}

func shortErr(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded), strings.Contains(err.Error(), "Client.Timeout"):
		return "timeout"
	case errors.Is(err, io.EOF), strings.Contains(err.Error(), "EOF"), strings.Contains(err.Error(), "connection reset"),
		strings.Contains(err.Error(), "connection refused"):
		// (net/http resends a request carrying an Idempotency-Key once on a
		// fresh connection when its connection closed before any answer:
		// the resend then finds the server gone.)
		return "connection lost"
	}
	return err.Error()
}

// story is one side's run of the story, and what its clients saw.
type story struct {
	mode, schema, dsn, redis string
	ctx                      context.Context // the demo's: SIGINT ends the requests
	srv                      *proc
	procs                    int

	doubleClick        []answer
	gatewayFirst       answer
	gatewayRetry       answer
	gatewayRetries     int
	amountFirst        answer
	amountSecond       answer
	many               []answer
	callbacks          []answer
	lateCallback       answer
	crashFirst         answer
	crashKilled        bool
	crashRowsAfterKill int
	crashRetry         answer
}

func (st *story) url(path string) string { return "http://" + st.srv.addr + path }

func (st *story) play(ctx context.Context) error {
	st.ctx = ctx
	var err error
	if st.srv, err = st.start(keyCrash); err != nil {
		return err
	}
	defer func() { st.srv.kill() }()
	fmt.Printf("\n[%s] server process 1 at %s (it dies of SIGKILL after committing the request with key %s)\n", st.mode, st.srv.addr, keyCrash)
	client := &http.Client{Timeout: 60 * time.Second}

	// 1. A double-click on the checkout form: two submits 10 ms apart.
	form, err := st.get(client, "/checkout?ref=form-1")
	if err != nil {
		return err
	}
	token := regexp.MustCompile(`name="submit_token" value="([^"]*)"`).FindStringSubmatch(form)
	if token == nil {
		return errors.New("the checkout form has no submit_token field")
	}
	fields := url.Values{"submit_token": {token[1]}, "order_id": {"ord-1"}, "ref": {"form-1"}, "amount": {"30.00"}, "currency": {"EUR"}}.Encode()
	st.doubleClick = make([]answer, 2)
	var wg sync.WaitGroup
	for i := range st.doubleClick {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 10 * time.Millisecond)
			st.doubleClick[i] = st.post(client, "/checkout", "application/x-www-form-urlencoded", fields, nil)
		})
	}
	wg.Wait()
	fmt.Printf("[%s] 1. double-click on the form: %v, %v\n", st.mode, st.doubleClick[0], st.doubleClick[1])

	// 2. A gateway retry after a timeout: the provider takes 1.5 s, the
	// gateway gives up after 0.5 s and sends the request again; on 409 (the
	// first still running) it waits Retry-After and tries again.
	body := `{"order_id":"ord-1","amount":"12.50","currency":"EUR","ref":"gw-1"}`
	slow := map[string]string{"Idempotency-Key": keyGateway, DelayHeader: providerTime.String()}
	st.gatewayFirst = st.post(&http.Client{Timeout: gatewayLimit}, "/payments", "application/json", body, slow)
	for st.gatewayRetries = 1; ; st.gatewayRetries++ {
		st.gatewayRetry = st.post(client, "/payments", "application/json", body, slow)
		if st.gatewayRetry.status != http.StatusConflict || st.gatewayRetries == 30 {
			break
		}
		time.Sleep(time.Second)
	}
	fmt.Printf("[%s] 2. gateway: first attempt %v; retry %d: %v\n", st.mode, st.gatewayFirst, st.gatewayRetries, st.gatewayRetry)

	// 3. The same key with another amount.
	st.amountFirst = st.post(client, "/payments", "application/json",
		`{"order_id":"ord-1","amount":"30.00","currency":"EUR","ref":"amt-1"}`, map[string]string{"Idempotency-Key": keyAmount})
	st.amountSecond = st.post(client, "/payments", "application/json",
		`{"order_id":"ord-1","amount":"45.00","currency":"EUR","ref":"amt-1"}`, map[string]string{"Idempotency-Key": keyAmount})
	fmt.Printf("[%s] 3. same key, 30.00 then 45.00: %v, then %v\n", st.mode, st.amountFirst, st.amountSecond)

	// 4. 20 copies of one request at once.
	st.many = make([]answer, copies)
	start := make(chan struct{})
	for i := range st.many {
		wg.Go(func() {
			<-start
			st.many[i] = st.post(client, "/payments", "application/json",
				`{"order_id":"ord-1","amount":"20.00","currency":"EUR","ref":"many-1"}`, map[string]string{"Idempotency-Key": keyMany})
		})
	}
	close(start)
	wg.Wait()
	fmt.Printf("[%s] 4. %d concurrent copies: %s\n", st.mode, copies, tallyAnswers(st.many))

	// 5. The provider's callback for ord-1, delivered three times (new
	// event IDs each time), then a late one for the cancelled ord-2.
	for i := range 3 {
		st.callbacks = append(st.callbacks, st.post(client, "/callbacks/provider", "application/json",
			fmt.Sprintf(`{"event_id":"evt-%d","order_id":"ord-1"}`, i+1), nil))
	}
	st.lateCallback = st.post(client, "/callbacks/provider", "application/json", `{"event_id":"evt-9","order_id":"ord-2"}`, nil)
	fmt.Printf("[%s] 5. callback for ord-1 three times: %v, %v, %v; late callback for cancelled ord-2: %v\n",
		st.mode, st.callbacks[0], st.callbacks[1], st.callbacks[2], st.lateCallback)

	// 6. A crash between the commit and the response: the server dies of
	// SIGKILL; the client retries against the restarted server.
	crash := `{"order_id":"ord-1","amount":"99.00","currency":"EUR","ref":"crash-1"}`
	st.crashFirst = st.post(client, "/payments", "application/json", crash, map[string]string{"Idempotency-Key": keyCrash})
	if st.crashKilled, err = st.srv.waitKilled(60 * time.Second); err != nil {
		return err
	}
	if err := st.countRows("crash-1", &st.crashRowsAfterKill); err != nil {
		return err
	}
	if st.srv, err = st.start(""); err != nil {
		return err
	}
	st.crashRetry = st.post(client, "/payments", "application/json", crash, map[string]string{"Idempotency-Key": keyCrash})
	fmt.Printf("[%s] 6. crash after commit: %v; process died of SIGKILL: %v; payment rows then: %d; retry on process 2: %v\n",
		st.mode, st.crashFirst, st.crashKilled, st.crashRowsAfterKill, st.crashRetry)
	return st.srv.stop()
}

// countRows counts the side's payments of ref into n (its own short
// connection: the demo's pool is the summary's).
func (st *story) countRows(ref string, n *int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, st.dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	return conn.QueryRow(ctx, `select count(*) from `+tablesFor(st.schema, st.mode).payments+` where ref = $1`, ref).Scan(n)
}

func (st *story) get(client *http.Client, path string) (string, error) {
	req, _ := http.NewRequestWithContext(st.ctx, http.MethodGet, st.url(path), nil)
	req.Header.Set("X-User", user)
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b), err
}

func (st *story) post(client *http.Client, path, contentType, body string, headers map[string]string) answer {
	req, _ := http.NewRequestWithContext(st.ctx, http.MethodPost, st.url(path), strings.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("X-User", user)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, replayed: resp.Header.Get(httpidem.ReplayHeader) == "true",
		paymentID: resp.Header.Get(httpidem.ResourceIDHeader), body: string(b), err: err}
}

func tallyAnswers(as []answer) string {
	n := map[string]int{}
	for _, a := range as {
		k := a.String()
		if a.err == nil {
			k = strconv.Itoa(a.status)
			if a.replayed {
				k += " replay"
			}
		}
		n[k]++
	}
	var parts []string
	for k, v := range n {
		parts = append(parts, fmt.Sprintf("%d× %s", v, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// proc is a server process.
type proc struct {
	cmd  *exec.Cmd
	addr string
	done chan error
}

func (st *story) start(crashKey string) (*proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "serve", "-mode", st.mode, "-schema", st.schema, "-dsn", st.dsn, "-redis", st.redis, "-crash-key", crashKey)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	st.procs++
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				lines <- a
			}
		}
		p.done <- cmd.Wait()
	}()
	select {
	case p.addr = <-lines:
		return p, nil
	case err := <-p.done:
		return nil, fmt.Errorf("server process ended before listening: %v", err)
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		return nil, errors.New("server process did not listen within 60s")
	}
}

// waitKilled waits for the process to end and reports whether SIGKILL
// ended it.
func (p *proc) waitKilled(d time.Duration) (bool, error) {
	select {
	case err := <-p.done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				return true, nil
			}
		}
		return false, nil
	case <-time.After(d):
		return false, fmt.Errorf("the server did not die within %s of the crash request", d)
	}
}

// stop ends the process with SIGTERM (a graceful shutdown).
func (p *proc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			return fmt.Errorf("the server did not shut down cleanly on SIGTERM: %w", err)
		}
		return nil
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		return errors.New("the server did not stop within 60s of SIGTERM")
	}
}

func (p *proc) kill() {
	if p != nil && p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
	}
}

// sideRows is what one side's tables hold.
type sideRows struct {
	payments   map[string][]string // ref → amounts
	paymentIDs map[string][]string // ref → payment IDs
	ledger     map[string]int      // order → credits
	taken      string              // sum of payment amounts
	credited   string              // sum of ledger amounts
	status     map[string]string   // order → status
	version    map[string]int64    // order → version
}

func readSide(ctx context.Context, pool *pgxpool.Pool, t tables) (sideRows, error) {
	r := sideRows{payments: map[string][]string{}, paymentIDs: map[string][]string{}, ledger: map[string]int{}, status: map[string]string{}, version: map[string]int64{}}
	rows, err := pool.Query(ctx, `select ref, amount::text, id from `+t.payments+` order by id`)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var ref, amount string
		var id int64
		if err := rows.Scan(&ref, &amount, &id); err != nil {
			return r, err
		}
		r.payments[ref] = append(r.payments[ref], amount)
		r.paymentIDs[ref] = append(r.paymentIDs[ref], "pay_"+strconv.FormatInt(id, 10))
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	if err := pool.QueryRow(ctx, `select coalesce(sum(amount), 0)::text from `+t.payments).Scan(&r.taken); err != nil {
		return r, err
	}
	if err := pool.QueryRow(ctx, `select coalesce(sum(amount), 0)::text from `+t.ledger).Scan(&r.credited); err != nil {
		return r, err
	}
	rows, err = pool.Query(ctx, `select order_id, count(*) from `+t.ledger+` group by order_id`)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var o string
		var n int
		if err := rows.Scan(&o, &n); err != nil {
			return r, err
		}
		r.ledger[o] = n
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	rows, err = pool.Query(ctx, `select id, status, version from `+t.orders)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var o, s string
		var v int64
		if err := rows.Scan(&o, &s, &v); err != nil {
			return r, err
		}
		r.status[o], r.version[o] = s, v
	}
	return r, rows.Err()
}

func summarize(ctx context.Context, pool *pgxpool.Pool, schema string, stories map[string]*story) error {
	is, err := readSide(ctx, pool, tablesFor(schema, "idemq"))
	if err != nil {
		return err
	}
	ns, err := readSide(ctx, pool, tablesFor(schema, "naive"))
	if err != nil {
		return err
	}
	s := pgx.Identifier{schema}.Sanitize()
	records := map[string]string{}
	rows, err := pool.Query(ctx, `select message_id, status from `+s+`.consumption_records`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			return err
		}
		records[id] = status
	}
	if err := rows.Err(); err != nil {
		return err
	}
	dl := map[string]int{}
	rows, err = pool.Query(ctx, `select reason, count(*) from `+s+`.dead_letters group by reason`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var reason string
		var n int
		if err := rows.Scan(&reason, &n); err != nil {
			return err
		}
		dl[reason] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}

	idq, nv := stories["idemq"], stories["naive"]
	fmt.Printf("\n=== idemq HTTP demo: payments (schema %s) ===\n", schema)
	fmt.Println("computed from the database rows after the story:")
	fmt.Println()
	row := func(label string, a, b any) { fmt.Printf("%-52s %-16v %v\n", label, a, b) }
	cnt := func(r sideRows, ref string) int { return len(r.payments[ref]) }
	row("", "with idemq", "naive")
	row("server processes (the first SIGKILLed)", idq.procs, nv.procs)
	row("1. double-click on the form: payments", cnt(is, "form-1"), cnt(ns, "form-1"))
	row("2. gateway retry after a timeout: payments", cnt(is, "gw-1"), cnt(ns, "gw-1"))
	row("3. same key, another amount: payments (amounts)", fmt.Sprintf("%d %v", cnt(is, "amt-1"), is.payments["amt-1"]), fmt.Sprintf("%d %v", cnt(ns, "amt-1"), ns.payments["amt-1"]))
	row("4. 20 concurrent copies: payments", cnt(is, "many-1"), cnt(ns, "many-1"))
	row("5. callback ×3: ledger credits for ord-1 (version)", fmt.Sprintf("%d (v%d)", is.ledger["ord-1"], is.version["ord-1"]), fmt.Sprintf("%d (v%d)", ns.ledger["ord-1"], ns.version["ord-1"]))
	row("   late callback, cancelled ord-2: credits", fmt.Sprintf("%d (%s)", is.ledger["ord-2"], is.status["ord-2"]), fmt.Sprintf("%d (%s)", ns.ledger["ord-2"], ns.status["ord-2"]))
	row("6. crash after commit, then retry: payments", cnt(is, "crash-1"), cnt(ns, "crash-1"))
	row("money taken / credited to the merchant", is.taken+" / "+is.credited, ns.taken+" / "+ns.credited)

	var failed []string
	check := func(ok bool, what string) {
		if !ok {
			failed = append(failed, what)
		}
	}
	for _, ref := range []string{"form-1", "gw-1", "amt-1", "many-1", "crash-1"} {
		check(cnt(is, ref) == 1, "exactly one payment row for "+ref)
	}
	check(len(is.payments["amt-1"]) == 1 && is.payments["amt-1"][0] == "30.00", "the reused key kept its first amount (30.00)")
	check(idq.amountSecond.status == http.StatusUnprocessableEntity, "the reused key with another amount was answered 422")
	check(dl[dedup.ReasonPayloadConflict] == 1, fmt.Sprintf("one payload_conflict dead letter keeps the 45.00 request (dead letters %v)", dl))
	for _, k := range []string{keyGateway, keyAmount, keyMany, keyCrash} {
		check(records[k] == string(dedup.StatusSucceeded), "the record of "+k+" is SUCCEEDED")
	}
	check(is.status["ord-1"] == "PAID" && is.version["ord-1"] == 1 && is.ledger["ord-1"] == 1, "ord-1 changed once (PAID, version 1) and was credited once")
	check(is.status["ord-2"] == "CANCELLED" && is.ledger["ord-2"] == 0 && idq.lateCallback.status == http.StatusConflict, "the cancelled ord-2 was not paid nor credited (409)")
	check(idq.crashKilled && idq.crashFirst.err != nil && idq.crashRowsAfterKill == 1, "the server died of SIGKILL after the commit, before the response")
	check(idq.crashRetry.status == http.StatusCreated && idq.crashRetry.replayed && ids(is, "crash-1") == idq.crashRetry.paymentID,
		"the retry after the crash replayed the committed payment")
	check(idq.gatewayRetry.status == http.StatusCreated && ids(is, "gw-1") == idq.gatewayRetry.paymentID, "the gateway's retry got the first payment")
	check(sameAnswers(idq.doubleClick, ids(is, "form-1")), "both clicks were answered with the one payment (201, or 409 while it ran)")
	check(sameAnswers(idq.many, ids(is, "many-1")), "the 20 copies were answered with the one payment (201, or 409 while it ran)")
	check(noServerErrors(idq), "no 5xx answers")
	sort.Strings(failed)
	fmt.Println()
	if len(failed) > 0 {
		fmt.Println("INVARIANTS FAILED:")
		for _, f := range failed {
			fmt.Println("  -", f)
		}
		return errors.New("idemq invariants failed")
	}
	fmt.Println("invariants (idemq): OK: one payment per request, the first amount kept, one credit per paid order, none for a cancelled one, the crash absorbed")
	var scope string
	if err := pool.QueryRow(ctx, `select scope from `+s+`.dead_letters where message_id = $1`, keyAmount).Scan(&scope); err != nil {
		return err
	}
	fmt.Printf("\nthe schema %s is kept for a look (the HTTP records are consumption records; scope: tenant|principal|method|route):\n"+
		"  go run ./cmd/idemq dead-letters list --schema %s --scope '%s'\n"+
		"  go run ./cmd/idemq inspect --schema %s --scope '%s' --message-id %s\n  (drop it with: drop schema %s cascade)\n",
		schema, schema, scope, schema, scope, keyAmount, schema)
	return nil
}

// ids is the payment ID of ref's only row ("" unless exactly one).
func ids(r sideRows, ref string) string {
	if len(r.paymentIDs[ref]) != 1 {
		return ""
	}
	return r.paymentIDs[ref][0]
}

// sameAnswers: every answer is 201 with payment id, or 409 (a copy that
// came while the first ran, answered after InFlightWait), and at least one
// is 201.
func sameAnswers(as []answer, id string) bool {
	created := 0
	for _, a := range as {
		switch {
		case a.err == nil && a.status == http.StatusCreated && a.paymentID == id && id != "":
			created++
		case a.err == nil && a.status == http.StatusConflict:
		default:
			return false
		}
	}
	return created > 0
}

func noServerErrors(st *story) bool {
	all := append(append(append([]answer{st.gatewayRetry, st.amountFirst, st.amountSecond, st.lateCallback, st.crashRetry}, st.doubleClick...), st.many...), st.callbacks...)
	for _, a := range all {
		if a.err != nil || a.status >= 500 {
			return false
		}
	}
	return true
}
