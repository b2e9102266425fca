package outbox

import (
	"context"
	"errors"
	"fmt"
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

// markTimeout bounds the marks and COMMIT of a batch, which run even when the
// relay's context has ended (whatever was published is recorded, so a
// graceful shutdown republishes nothing).
const markTimeout = 30 * time.Second

func (r *Relay) runBatch(ctx context.Context) (BatchResult, error) {
	var res BatchResult
	conn, err := r.ob.pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("idemq/outbox: begin: %w", err)
	}
	defer r.endTx(ctx, conn)

	chains, err := r.claim(ctx, conn)
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
	published, failed := publishChains(ctx, r.pub, chains, r.cfg.PublishTimeout)
	spans.end(published, failed)
	failed, unavailable := splitUnavailable(failed)
	res.Unavailable = len(unavailable)
	r.unavailable.Add(int64(len(unavailable)))

	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
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
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
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
// relays, or the outbox is nearly empty) does a second statement walk the
// keys from where the previous walk of this relay stopped (round robin), so
// every key progresses however deep the backlog of other keys.
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
	// not see every unpublished row (or saw only blocked ones).
	if len(c.heads) < r.cfg.MaxKeys && len(c.heads)+len(c.followers) < r.cfg.BatchSize &&
		(c.windowFull || len(c.heads) == 0) {
		if err := r.claimWalk(ctx, conn, &c); err != nil {
			return nil, fmt.Errorf("idemq/outbox: claim: walk keys: %w", err)
		}
	}
	return buildChains(c.heads, c.followers), nil
}

// claimWalk adds to c the heads found by a walk over the keys from this
// relay's cursor (MaxKeys keys at most), and their followers, leaving out
// the heads c holds already, and moves the cursor.
func (r *Relay) claimWalk(ctx context.Context, conn *pgxpool.Conn, c *claimed) error {
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
	rows, err := conn.Query(ctx, r.ob.q.claimWalkSQL, r.cfg.MaxKeys-len(c.heads),
		r.cfg.BatchSize-len(c.heads)-len(c.followers), held, topic, key, r.cfg.MaxKeys)
	if err != nil {
		return err
	}
	c.walked = -1
	if err := r.scanClaimRows(rows, c); err != nil {
		return err
	}
	if c.walked < 0 {
		return errors.New("no walk summary row")
	}
	r.cursorMu.Lock()
	if c.walked < int64(r.cfg.MaxKeys) {
		r.cursorTop, r.cursorKey = "", nil // the walk reached the end: start over
	} else {
		r.cursorTop, r.cursorKey = c.lastTopic, c.lastKey
	}
	r.cursorMu.Unlock()
	return nil
}

// claimed collects the rows of the claim statements: heads (kind 0),
// followers (kind 1) and, from claim_walk, the walk's summary (kind 2).
type claimed struct {
	heads      []item
	followers  []follower
	windowFull bool // claim's window held all the rows it asked for
	walked     int64
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
			&f.attempts, &f.ready, &row.MessageID, &full); err != nil {
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
			c.walked, c.lastTopic, c.lastKey = f.seq, row.Topic, row.Key
		}
	}
	return rows.Err()
}
