package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The claim transaction travels in two round trips when the oldest rows fill
// the batch: BEGIN and the claim statement go in one pipelined batch, the
// marks and COMMIT in another, with the publish in between. The transaction
// is run on an acquired connection rather than through pgx.Tx because pgx
// has no way to pipeline COMMIT behind other statements of a pgx.Tx.
const (
	beginSQL  = "begin isolation level read committed"
	commitSQL = "commit"
)

// detached returns a context with ctx's values, not canceled with it, and
// bounded by StatementTimeout: for the marks, COMMIT and rollback of a
// batch, which run even when the relay's context has ended (whatever was
// published is recorded, so a graceful shutdown republishes nothing).
func (r *Relay) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StatementTimeout)
}

func (r *Relay) runBatch(ctx context.Context) (BatchResult, error) {
	var res BatchResult
	// The pool's dial and the claim, bounded by StatementTimeout.
	cctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
	defer cancel()
	conn, err := r.ob.pool.Acquire(cctx)
	if err != nil {
		return res, fmt.Errorf("idemq/outbox: begin: %w", err)
	}
	defer r.endTx(ctx, conn)

	chains, err := r.claim(cctx, conn)
	cancel()
	if err != nil {
		return res, err
	}
	for _, c := range chains {
		res.Claimed += len(c)
	}
	if res.Claimed == 0 {
		return res, nil // endTx rolls back: nothing was written
	}
	r.batches.Add(1)
	r.claimed.Add(int64(res.Claimed))

	spans := r.startSendSpans(ctx, chains)
	published, failed := publishChains(ctx, r.pub, chains, r.cfg.PublishTimeout, func() error {
		// One round trip on the claim transaction between rounds: a claim
		// lost while a round was out (its backend terminated, Postgres
		// restarted) frees the rows for other relays, and publishing more
		// of them would race their publishes. Not canceled with ctx: a
		// graceful stop still marks what was published.
		cctx, cancel := r.detached(ctx)
		defer cancel()
		_, err := conn.Exec(cctx, "select 1")
		return err
	})
	spans.end(published, failed)
	failed, unavailable := splitUnavailable(failed)
	res.Unavailable = len(unavailable)
	r.unavailable.Add(int64(len(unavailable)))

	mctx, cancel := r.detached(ctx)
	defer cancel()
	parkedIDs, retryIn, err := r.markAndCommit(mctx, conn, published, failed)
	if err != nil {
		return res, err
	}
	res.Published, res.Failed, res.Parked, res.RetryIn = len(published), len(failed), len(parkedIDs), retryIn
	r.published.Add(int64(res.Published))
	r.failed.Add(int64(res.Failed))
	r.parked.Add(int64(res.Parked))
	if len(failed) > 0 {
		r.log.WarnContext(ctx, "idemq: outbox publish failed; will retry", "failed", len(failed), "published", len(published),
			"retry_in", res.RetryIn, "err", failed[0].err)
	}
	for _, id := range parkedIDs {
		r.log.ErrorContext(ctx, "idemq: outbox row parked after too many failed publishes; its key is held until Unpark",
			"id", id, "max_attempts", r.cfg.MaxAttempts)
	}
	return res, nil
}

// endTx rolls back the transaction a batch left open (an empty claim, an
// error, a panic) and returns the connection to the pool, which destroys it
// if it is still not idle (the rollback failed, the connection broke).
func (r *Relay) endTx(ctx context.Context, conn *pgxpool.Conn) {
	if pc := conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		rctx, cancel := r.detached(ctx)
		_, _ = conn.Exec(rctx, "rollback")
		cancel()
	}
	conn.Release()
}

// markAndCommit records the outcome of a batch and commits, in one round
// trip: the published rows are marked, the failed ones get their error,
// retry time or parking, then COMMIT. It returns the IDs of the rows parked
// and the shortest retry delay given. An error means nothing was committed
// (a failed statement aborts the transaction, and the statements behind it
// in the pipeline are not run).
func (r *Relay) markAndCommit(ctx context.Context, conn *pgxpool.Conn, published []item, failed []failure) (parked []uuid.UUID, retryIn time.Duration, err error) {
	b := &pgx.Batch{}
	if len(published) > 0 {
		seqs := make([]int64, len(published))
		for i, it := range published {
			seqs[i] = it.seq
		}
		b.Queue(r.ob.q.publishedSQL, seqs, r.cfg.Name)
	}
	if len(failed) > 0 {
		seqs := make([]int64, len(failed))
		texts := make([]string, len(failed))
		delays := make([]float64, len(failed))
		for i, f := range failed {
			seqs[i] = f.seq
			texts[i] = errorText(f.err, r.cfg.MaxErrorBytes)
			d := retryDelay(f.attempts+1, r.cfg.RetryInitial, r.cfg.RetryMax, jitter())
			delays[i] = d.Seconds()
			if retryIn == 0 || d < retryIn {
				retryIn = d
			}
		}
		b.Queue(r.ob.q.failedSQL, seqs, texts, delays, r.cfg.MaxAttempts)
	}
	b.Queue(commitSQL)
	br := conn.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	if len(published) > 0 {
		if _, err := br.Exec(); err != nil {
			return nil, 0, fmt.Errorf("idemq/outbox: mark %d rows published: %w", len(published), err)
		}
	}
	if len(failed) > 0 {
		rows, err := br.Query()
		if err != nil {
			return nil, 0, fmt.Errorf("idemq/outbox: record %d failed publishes: %w", len(failed), err)
		}
		for rows.Next() {
			var seq int64
			var id uuid.UUID
			var isParked bool
			if err := rows.Scan(&seq, &id, &isParked); err != nil {
				rows.Close()
				return nil, 0, fmt.Errorf("idemq/outbox: record failed publishes: %w", err)
			}
			if isParked {
				parked = append(parked, id)
			}
		}
		if err := rows.Err(); err != nil {
			return nil, 0, fmt.Errorf("idemq/outbox: record %d failed publishes: %w", len(failed), err)
		}
	}
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("the server answered %q", tag.String())
	}
	if err == nil {
		err = br.Close()
	}
	if err != nil {
		return nil, 0, fmt.Errorf("idemq/outbox: commit batch: %w", err)
	}
	return parked, retryIn, nil
}

// splitUnavailable separates the failures of rows from those of an
// unavailable broker (IsUnavailable). The latter are left unrecorded: the
// row gets no attempt, no error and no retry time, so the broker's outage
// never parks it, and its key's order holds because the row is still its
// key's head.
func splitUnavailable(failed []failure) (rows, unavailable []failure) {
	for _, f := range failed {
		if IsUnavailable(f.err) {
			unavailable = append(unavailable, f)
		} else {
			rows = append(rows, f)
		}
	}
	return rows, unavailable
}

// claim begins the transaction, locks up to MaxKeys heads and reads the
// followers of their keys, and returns one chain per head (see
// buildChains). BEGIN and the first claim statement travel together; it
// takes its heads from the oldest unpublished rows (and the oldest keyless
// ones). Only when those do not fill the batch (fewer than BatchSize rows
// and fewer than MaxKeys keys: the oldest rows are blocked, held by other
// relays, or the outbox is nearly empty) does a walk statement go over the
// keys from where the previous walk of this relay stopped (round robin),
// stepping over the keys whose head is not due (parked, delayed, or waiting
// out a retry delay) without counting them, so every key progresses however
// deep the backlog of other keys and however many keys are blocked. A walk
// that runs out of keys before the batch is full starts over once from the
// first key; one walk statement steps over at most walkKeys blocked keys,
// and the next claim goes on from where it stopped.
func (r *Relay) claim(ctx context.Context, conn *pgxpool.Conn) ([][]item, error) {
	b := &pgx.Batch{}
	b.Queue(beginSQL)
	b.Queue(r.ob.q.claimSQL, r.cfg.MaxKeys, r.cfg.BatchSize, []int64(nil), 2*r.cfg.MaxKeys)
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("idemq/outbox: begin: %w", err)
	}
	var c claimed
	err := r.scanClaim(br, &c)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("idemq/outbox: claim: %w", err)
	}
	// A walk can add heads only when the batch has room and the window did
	// not see every unpublished row (or saw only blocked ones). When the
	// window's heads include heads that failed before (attempts > 0), the
	// walk also looks for as many more heads, since the keys behind them
	// may have been due longer: every candidate locked, the batch keeps the
	// MaxKeys due the longest (trim), so a key the broker keeps refusing
	// takes a place only when its retry time comes before the others' rows.
	retried, retriedRows := 0, 0
	for _, h := range c.heads {
		if h.attempts > 0 {
			retried++
			retriedRows++
		}
	}
	if retried > 0 {
		for _, chain := range buildChains(c.heads, c.followers) {
			if chain[0].attempts > 0 {
				retriedRows += len(chain) - 1
			}
		}
	}
	target, budget := r.cfg.MaxKeys+retried, r.cfg.BatchSize+retriedRows
	if len(c.heads) < target && len(c.heads)+len(c.followers) < budget &&
		(c.windowFull || len(c.heads) == 0) {
		r.cursorMu.Lock()
		fromStart := r.cursorKey == nil
		r.cursorMu.Unlock()
		for {
			ended, err := r.claimWalk(ctx, conn, &c, target-len(c.heads), budget-len(c.heads)-len(c.followers))
			if err != nil {
				return nil, fmt.Errorf("idemq/outbox: claim: walk keys: %w", err)
			}
			if !ended || fromStart || len(c.heads) >= target || len(c.heads)+len(c.followers) >= budget {
				break
			}
			fromStart = true // the walk ran out of keys: once more from the first key
		}
	}
	return trim(buildChains(c.heads, c.followers), r.cfg.MaxKeys, r.cfg.BatchSize), nil
}

// trim keeps the maxKeys chains whose heads have been due the longest
// (available_at, then seq), and cuts the kept chains' followers so that
// maxRows rows are left at most (each chain keeps its head). The heads of
// the chains left out stay locked, unpublished and untouched until the
// transaction ends.
func trim(chains [][]item, maxKeys, maxRows int) [][]item {
	if len(chains) > maxKeys {
		slices.SortStableFunc(chains, func(a, b []item) int {
			if c := a[0].dueAt.Compare(b[0].dueAt); c != 0 {
				return c
			}
			return cmp.Compare(a[0].seq, b[0].seq)
		})
		chains = chains[:maxKeys]
		slices.SortFunc(chains, func(a, b []item) int { return cmp.Compare(a[0].seq, b[0].seq) })
	}
	rows := 0
	for _, c := range chains {
		rows += len(c)
	}
	if rows > maxRows {
		left := maxRows - len(chains)
		for i, c := range chains {
			n := min(len(c)-1, max(left, 0))
			chains[i] = c[:1+n]
			left -= n
		}
	}
	return chains
}

// claimWalk adds to c the heads found by one walk statement over the keys
// from this relay's cursor (up to need heads, stepping over keys whose head
// is not due, at most walkKeys keys), and their followers (about budget
// rows in all), leaving out the heads c holds already, and moves the
// cursor. It reports whether the walk ran out of keys (the cursor is back
// at the start).
func (r *Relay) claimWalk(ctx context.Context, conn *pgxpool.Conn, c *claimed, need, budget int) (ended bool, err error) {
	r.cursorMu.Lock()
	topic, key := r.cursorTop, r.cursorKey
	r.cursorMu.Unlock()
	if key == nil {
		key = []byte{}
	}
	held := make([]int64, len(c.heads))
	for i, h := range c.heads {
		held[i] = h.seq
	}
	rows, err := conn.Query(ctx, r.ob.q.claimWalkSQL, need, max(budget, 1), held, topic, key, need+walkKeys)
	if err != nil {
		return false, err
	}
	c.walked = -1
	if err := r.scanClaimRows(rows, c); err != nil {
		return false, err
	}
	if c.walked < 0 {
		return false, errors.New("no walk summary row")
	}
	r.cursorMu.Lock()
	if c.walkEnded {
		r.cursorTop, r.cursorKey = "", nil // the walk reached the end: start over
	} else {
		r.cursorTop, r.cursorKey = c.lastTopic, c.lastKey
	}
	r.cursorMu.Unlock()
	return c.walkEnded, nil
}

// walkKeys is how many keys one walk statement visits at most beyond the
// heads it looks for: it bounds the statement's work (one index descent and
// one row read per key) when many keys are blocked. A claim runs at most two
// walk statements; the next claim goes on from where they stopped.
const walkKeys = 1000

// claimed collects the rows of the claim statements: heads (kind 0),
// followers (kind 1) and, from claim_walk, the walk's summary (kind 2).
type claimed struct {
	heads      []item
	followers  []follower
	windowFull bool // claim's window held all the rows it asked for
	walked     int64
	walkEnded  bool // the walk ran out of keys
	lastTopic  string
	lastKey    []byte
}

func (r *Relay) scanClaim(br pgx.BatchResults, c *claimed) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	return r.scanClaimRows(rows, c)
}

// scanClaimRows reads the rows of claim or claim_walk into c and closes
// rows.
func (r *Relay) scanClaimRows(rows pgx.Rows, c *claimed) error {
	defer rows.Close()
	for rows.Next() {
		var kind int32
		var f follower
		var row Row
		var full bool
		if err := rows.Scan(&kind, &f.seq, &row.ID, &row.Topic, &row.Key, &row.Headers, &row.Payload, &row.CausationID,
			&f.attempts, &f.ready, &row.MessageID, &full, &f.dueAt); err != nil {
			return err
		}
		c.windowFull = c.windowFull || full
		switch kind {
		case 0:
			f.env = r.ob.Envelope(row)
			c.heads = append(c.heads, f.item)
		case 1:
			f.env = r.ob.Envelope(row)
			c.followers = append(c.followers, f)
		default:
			c.walked, c.walkEnded, c.lastTopic, c.lastKey = f.seq, f.ready, row.Topic, row.Key
		}
	}
	return rows.Err()
}
