package pgstore

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/namedsql"
	"github.com/jackc/pgx/v5"
)

// sqlFS holds the store's statements, one "-- name:" block each.
//
//go:embed sql/*.sql
var sqlFS embed.FS

// statements is sql/*.sql parsed once, at package initialization (a
// malformed or duplicated name panics here, and fails every test).
var statements = namedsql.MustParseFS(sqlFS, "sql/*.sql")

// queries holds the SQL of one Store: the named statements of sql/*.sql
// with the store's quoted table names filled in once, by New.
type queries struct {
	tables        map[string]any // template data: quoted names, also used by the migrations
	lanes         string         // quoted lane watermark table
	maxErrorBytes int            // Config.MaxErrorBytes

	// records.sql
	claimInsertSQL, recordClaimSQL, recordLockSQL, recordLockOpenSQL, handlerSavepointSQL, handlerRollbackSQL, handlerReleaseSQL, recordReclaimSQL,
	recordSetFingerprintSQL, recordMarkSucceededSQL, recordMarkFailedSQL, deadLetterInsertSQL,
	deadLetterLiveIDSQL string
	// batch.sql (batch_set.go)
	recordsClaimSetSQL, recordsLockSetSQL, recordsUnclaimSetSQL string
	// commit.sql
	recordMarkSucceededAtCommitSQL string
	// lease.sql
	leaseClaimSQL, leaseLockSQL, leaseTakeSQL, leaseBeatSQL, leaseDoneSQL, leaseReleaseSQL, leaseFailSQL,
	leaseOwnClaimSQL, leaseOwnExhaustSQL string
	// crashloop.sql
	laneWatermarkAdvanceSQL, replayPeekSQL, startMarkInsertSQL, startMarkLockSQL, startMarkSetSQL,
	startMarkClearSQL, recordExhaustLostSQL string
	// admin.sql
	lookupByMessageIDSQL, lookupByBusinessKeySQL, deadLettersListSQL, deadLettersPrefixSQL, redriveRecordSQL, redriveRecordStatusSQL,
	redriveDeadLettersSQL, purgeBoundSQL, purgeSQL, deadLetterLockSQL, businessKeyHolderSQL, redriveAuditInsertSQL,
	redriveAuditGetSQL, redriveAuditPublishedSQL string
	// deadletters.sql
	deadLettersBoundSQL, deadLettersRedriveStepSQL, deadLettersRedriveDrySQL, deadLetterShareSQL,
	republishInsertSQL, republishGetSQL, republishSetOutboxSQL string
}

// tableNames are the quoted table and index names of cfg: the template data
// of both the statements (sql/*.sql) and the migrations (migrations/*.sql).
// Every name is a pgx.Identifier, sanitized (quoted); cfg's names were
// checked against identRe first.
func tableNames(cfg Config) map[string]any {
	qualified := func(name string) string { return pgx.Identifier{cfg.Schema, name}.Sanitize() }
	ident := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	r, d := cfg.RecordsTable, cfg.DeadLettersTable
	return map[string]any{
		"schema":                   ident(cfg.Schema), // to qualify an index name (DROP INDEX)
		"records":                  qualified(r),
		"dead_letters":             qualified(d),
		"lane_watermarks":          qualified(r + laneWatermarksSuffix),
		"redrives":                 qualified(d + "_redrives"),
		"records_message_id_key":   ident(r + "_message_id_key"),
		"records_business_key_key": ident(r + "_business_key_key"),
		"records_expires_idx":      ident(r + "_expires_idx"),
		"dead_letters_live_key":    ident(d + "_live_key"),
		"dead_letters_created_idx": ident(d + "_created_idx"),
		"redrives_dead_letter_key": ident(d + "_redrives_dl_key"),
		// Dead-letter tooling (deadletters.go, migration 007).
		"dead_letters_scope_id_idx": ident(d + "_scope_id_idx"),
		"republishes":               qualified(d + "_republishes"),
		"republishes_key":           ident(d + "_republishes_key"),
		// HTTP requests (http.go, httpsql/http.sql, migration 006).
		"http_responses":                qualified(r + "_http"),
		"http_responses_unfinished_idx": ident(r + "_http_unfinished_idx"),
	}
}

// newQueries fills the statements with cfg's table names. It fails only when
// the code and sql/*.sql disagree on the names (TestStatementsBind).
func newQueries(cfg Config) (queries, error) {
	q := queries{tables: tableNames(cfg), maxErrorBytes: cfg.MaxErrorBytes}
	q.lanes, _ = q.tables["lane_watermarks"].(string)
	err := statements.Bind(q.tables, map[string]*string{
		"claim_insert":           &q.claimInsertSQL,
		"record_claim":           &q.recordClaimSQL,
		"record_lock":            &q.recordLockSQL,
		"record_lock_open":       &q.recordLockOpenSQL,
		"handler_savepoint":      &q.handlerSavepointSQL,
		"handler_rollback":       &q.handlerRollbackSQL,
		"handler_release":        &q.handlerReleaseSQL,
		"record_reclaim":         &q.recordReclaimSQL,
		"record_set_fingerprint": &q.recordSetFingerprintSQL,
		"record_mark_succeeded":  &q.recordMarkSucceededSQL,
		"record_mark_failed":     &q.recordMarkFailedSQL,
		"dead_letter_insert":     &q.deadLetterInsertSQL,
		"dead_letter_live_id":    &q.deadLetterLiveIDSQL,

		"records_claim_set":               &q.recordsClaimSetSQL,
		"records_lock_set":                &q.recordsLockSetSQL,
		"records_unclaim_set":             &q.recordsUnclaimSetSQL,
		"record_mark_succeeded_at_commit": &q.recordMarkSucceededAtCommitSQL,

		"lease_claim":       &q.leaseClaimSQL,
		"lease_lock":        &q.leaseLockSQL,
		"lease_take":        &q.leaseTakeSQL,
		"lease_beat":        &q.leaseBeatSQL,
		"lease_done":        &q.leaseDoneSQL,
		"lease_release":     &q.leaseReleaseSQL,
		"lease_fail":        &q.leaseFailSQL,
		"lease_own_claim":   &q.leaseOwnClaimSQL,
		"lease_own_exhaust": &q.leaseOwnExhaustSQL,

		"lane_watermark_advance": &q.laneWatermarkAdvanceSQL,
		"replay_peek":            &q.replayPeekSQL,
		"start_mark_insert":      &q.startMarkInsertSQL,
		"start_mark_lock":        &q.startMarkLockSQL,
		"start_mark_set":         &q.startMarkSetSQL,
		"start_mark_clear":       &q.startMarkClearSQL,
		"record_exhaust_lost":    &q.recordExhaustLostSQL,

		"lookup_by_message_id":    &q.lookupByMessageIDSQL,
		"lookup_by_business_key":  &q.lookupByBusinessKeySQL,
		"dead_letters_list":       &q.deadLettersListSQL,
		"dead_letters_prefix":     &q.deadLettersPrefixSQL,
		"redrive_record":          &q.redriveRecordSQL,
		"redrive_record_status":   &q.redriveRecordStatusSQL,
		"redrive_dead_letters":    &q.redriveDeadLettersSQL,
		"purge_bound":             &q.purgeBoundSQL,
		"purge":                   &q.purgeSQL,
		"dead_letter_lock":        &q.deadLetterLockSQL,
		"business_key_holder":     &q.businessKeyHolderSQL,
		"redrive_audit_insert":    &q.redriveAuditInsertSQL,
		"redrive_audit_get":       &q.redriveAuditGetSQL,
		"redrive_audit_published": &q.redriveAuditPublishedSQL,

		"dead_letters_bound":        &q.deadLettersBoundSQL,
		"dead_letters_redrive_step": &q.deadLettersRedriveStepSQL,
		"dead_letters_redrive_dry":  &q.deadLettersRedriveDrySQL,
		"dead_letter_share":         &q.deadLetterShareSQL,
		"republish_insert":          &q.republishInsertSQL,
		"republish_get":             &q.republishGetSQL,
		"republish_set_outbox":      &q.republishSetOutboxSQL,
	})
	if err != nil {
		return queries{}, fmt.Errorf("idemq: statements: %w", err)
	}
	return q, nil
}

// lockLease is lock plus whether the record's lease is live in database time.
func (q *queries) lockLease(ctx context.Context, tx pgx.Tx, id dedup.Identity) (*record, bool, error) {
	var r record
	var status string
	var live bool
	err := tx.QueryRow(ctx, q.leaseLockSQL, id.Scope, id.MessageID, id.BusinessKey).
		Scan(&r.id, &r.messageID, &r.businessKey, &r.fingerprint, &r.keyID, &status, &r.attempts, &live)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("idemq: lock record %s: %w", id, err)
	}
	r.status = dedup.Status(status)
	return &r, live, nil
}

// newRecord is a consumption record to insert (claim_insert).
type newRecord struct {
	msg      *dedup.Message // identity, source and reconsume times
	sum      []byte         // payload fingerprint
	keyID    string         // the fingerprint's key ID
	status   dedup.Status
	attempts int
	// errText and errClass are the last error and its class ("" = none).
	errText, errClass string
	// expirySecs is the retention in seconds (nil: never expires).
	expirySecs *float64
}

func (r newRecord) args() []any {
	id := r.msg.Identity
	return []any{id.Scope, id.MessageID, id.BusinessKey, r.sum, r.keyID, string(r.status), r.attempts,
		r.errText, r.errClass, clip(r.msg.Source, 1024), r.msg.ReconsumeTimes, r.expirySecs}
}

// insert returns the new row's id, or 0 when a unique key already exists.
func (q *queries) insert(ctx context.Context, tx pgx.Tx, r newRecord) (int64, error) {
	var rowID int64
	err := tx.QueryRow(ctx, q.claimInsertSQL, r.args()...).Scan(&rowID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("idemq: claim %s: %w", r.msg.Identity, err)
	}
	return rowID, nil
}

// claimInsert claims r in one round trip: record_claim reads the record
// that already holds either unique key, or inserts r (status PROCESSING, or
// SUCCEEDED with its expiry when the caller commits only if the handler
// succeeds; attempts 1, no error); record_lock_open locks the existing
// record when it is not terminal; and the handler's savepoint is set.
//
// It returns the new row's id, or 0 and the existing record: locked when it
// is PROCESSING or FAILED_RETRYABLE, read without a lock when it is
// SUCCEEDED or FAILED_FINAL (a duplicate then writes nothing and takes no
// row lock, so its transaction commits without a WAL flush). It returns 0
// and nil when the record vanished or changed between the read and the lock
// (purged, or finished by another copy): the caller claims again. A record
// re-driven between the read (terminal) and the lock comes back locked, as
// it is now. A reclaim sets the savepoint again after its update.
//
// release queues handler_release first, in the same round trip: the caller
// (batched mode) still holds the previous message's savepoint, which can no
// longer be needed, so that savepoints never nest.
func (q *queries) claimInsert(ctx context.Context, tx pgx.Tx, r newRecord, release bool) (int64, *record, error) {
	id := r.msg.Identity
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 4)}
	if release {
		b.Queue(q.handlerReleaseSQL)
	}
	b.Queue(q.recordClaimSQL, r.args()...)
	b.Queue(q.recordLockOpenSQL, id.Scope, id.MessageID, id.BusinessKey)
	b.Queue(q.handlerSavepointSQL)
	br := tx.SendBatch(ctx, b)
	var err error
	if release {
		_, err = br.Exec()
	}
	var rowID *int64
	var found *record
	if err == nil {
		rowID, found, err = scanClaim(br.QueryRow())
	}
	var locked *record
	if err == nil {
		var l record
		var st string
		err = br.QueryRow().Scan(&l.id, &l.messageID, &l.businessKey, &l.fingerprint, &l.keyID, &st, &l.attempts)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			err = nil
		case err == nil:
			l.status = dedup.Status(st)
			locked = &l
		}
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, nil, fmt.Errorf("idemq: claim %s: %w", id, err)
	}
	switch {
	case rowID != nil:
		return *rowID, nil, nil
	case locked != nil:
		return 0, locked, nil
	}
	if found != nil && terminal(found.status) {
		return 0, found, nil
	}
	return 0, nil, nil
}

// reclaimReset is reclaim plus the handler's savepoint released and set
// again, in one round trip: the reclaim's update stays behind the new
// savepoint (the handler's rollback keeps it), and savepoints never nest.
func (q *queries) reclaimReset(ctx context.Context, tx pgx.Tx, rowID int64, msg *dedup.Message) (int, error) {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 3)}
	b.Queue(q.recordReclaimSQL, rowID, clip(msg.Source, 1024), msg.ReconsumeTimes)
	b.Queue(q.handlerReleaseSQL)
	b.Queue(q.handlerSavepointSQL)
	br := tx.SendBatch(ctx, b)
	var attempts int
	err := br.QueryRow().Scan(&attempts)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("idemq: reclaim %s: %w", msg.Identity, err)
	}
	return attempts, nil
}

// claimRecord is record_claim alone: the new row's id, or 0 and the record
// that holds either unique key, read without a lock (nil when the insert
// met a concurrent claim's record: lock it to see it). It is sent as a
// batch, so that a lazyTx's BEGIN travels with it.
func (q *queries) claimRecord(ctx context.Context, tx pgx.Tx, r newRecord) (int64, *record, error) {
	rowID, found, err := scanClaim(batchRow(ctx, tx, q.recordClaimSQL, r.args()...))
	if err != nil {
		return 0, nil, fmt.Errorf("idemq: claim %s: %w", r.msg.Identity, err)
	}
	if rowID != nil {
		return *rowID, nil, nil
	}
	return 0, found, nil
}

// scanClaim reads record_claim's row: the new id (nil when nothing was
// inserted) and the existing record (nil when none).
func scanClaim(row pgx.Row) (*int64, *record, error) {
	var rowID *int64
	var f foundRecord
	if err := row.Scan(&rowID, &f.id, &f.messageID, &f.businessKey, &f.fingerprint, &f.keyID, &f.status, &f.attempts); err != nil {
		return nil, nil, err
	}
	return rowID, f.record(), nil
}

// terminal reports whether st is final for duplicates: SUCCEEDED or
// FAILED_FINAL. Such a record is answered from a read and never locked; only
// a re-drive (FAILED_FINAL → FAILED_RETRYABLE) or a purge changes it.
func terminal(st dedup.Status) bool {
	return st == dedup.StatusSucceeded || st == dedup.StatusFailedFinal
}

// foundRecord is a record as record_claim or lease_claim return it: every
// column null when no record holds the identity.
type foundRecord struct {
	id                            *int64
	messageID, businessKey, keyID *string
	fingerprint                   []byte
	status                        *string
	attempts                      *int
	live                          *bool // lease_claim only
}

// record is r, or nil when no record was found.
func (r *foundRecord) record() *record {
	if r.id == nil || r.status == nil || r.messageID == nil || r.businessKey == nil || r.keyID == nil || r.attempts == nil {
		return nil
	}
	return &record{id: *r.id, messageID: *r.messageID, businessKey: *r.businessKey, fingerprint: r.fingerprint,
		keyID: *r.keyID, status: dedup.Status(*r.status), attempts: *r.attempts}
}

func (q *queries) lock(ctx context.Context, tx pgx.Tx, id dedup.Identity) (*record, error) {
	var r record
	var status string
	err := tx.QueryRow(ctx, q.recordLockSQL, id.Scope, id.MessageID, id.BusinessKey).
		Scan(&r.id, &r.messageID, &r.businessKey, &r.fingerprint, &r.keyID, &status, &r.attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idemq: lock record %s: %w", id, err)
	}
	r.status = dedup.Status(status)
	return &r, nil
}

func (q *queries) reclaim(ctx context.Context, tx pgx.Tx, rowID int64, msg *dedup.Message) (int, error) {
	var attempts int
	if err := tx.QueryRow(ctx, q.recordReclaimSQL, rowID, clip(msg.Source, 1024), msg.ReconsumeTimes).Scan(&attempts); err != nil {
		return 0, fmt.Errorf("idemq: reclaim %s: %w", msg.Identity, err)
	}
	return attempts, nil
}

func (q *queries) markSucceeded(ctx context.Context, tx pgx.Tx, id dedup.Identity, rowID int64, expirySecs float64) error {
	tag, err := tx.Exec(ctx, q.recordMarkSucceededSQL, rowID, expirySecs)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("idemq: mark succeeded %s: %d records in PROCESSING", id, tag.RowsAffected())
	}
	return nil
}

// attemptCount says whether a failure mark counts an attempt.
type attemptCount int

const (
	// attemptCounted: the claim in the same transaction already counted
	// this run's attempt (markClaimedFailed).
	attemptCounted attemptCount = iota
	// attemptNew: the mark counts a new attempt (a failure marked after the
	// handler's transaction rolled back, markFailedIn).
	attemptNew
)

// failureMark is a failure written on an existing record (record_mark_failed).
type failureMark struct {
	rowID    int64
	status   dedup.Status
	attempt  attemptCount
	msg      *dedup.Message // source and reconsume times
	errText  string
	errClass string
	// expirySecs is the retention in seconds (nil: never expires).
	expirySecs *float64
}

// args are record_mark_failed's arguments.
func (m failureMark) args() []any {
	return []any{m.rowID, string(m.status), m.errText, m.errClass, m.expirySecs,
		m.attempt == attemptNew, clip(m.msg.Source, 1024), m.msg.ReconsumeTimes}
}

func (q *queries) updateFailed(ctx context.Context, tx pgx.Tx, m failureMark) error {
	if _, err := tx.Exec(ctx, q.recordMarkFailedSQL, m.args()...); err != nil {
		return fmt.Errorf("idemq: mark %s: %w", m.status, err)
	}
	return nil
}

// deadLetterRow is a dead letter to write (dead_letter_insert): the whole
// message, why, and the record's attempts.
type deadLetterRow struct {
	msg    *dedup.Message
	sum    []byte // payload fingerprint (nil when it has none)
	reason string // dedup.Reason…
	cause  error
	// class is the error class; "" means dedup.ErrorClass(cause).
	class    string
	attempts int
}

// insertDeadLetter writes d and returns its id, or 0 when the live dead
// letter of the same message, reason and fingerprint exists already.
func (q *queries) insertDeadLetter(ctx context.Context, tx pgx.Tx, d deadLetterRow) (int64, error) {
	return scanDeadLetterID(d, tx.QueryRow(ctx, q.deadLetterInsertSQL, q.deadLetterArgs(d)...))
}

// deadLetterArgs are dead_letter_insert's arguments for d.
func (q *queries) deadLetterArgs(d deadLetterRow) []any {
	id := d.msg.Identity
	class := d.class
	if class == "" {
		class = dedup.ErrorClass(d.cause)
	}
	headers := make(map[string]string, len(d.msg.Headers))
	for k, v := range d.msg.Headers {
		headers[clip(k, 1024)] = clip(v, 8192)
	}
	// The headers go as JSON text cast to jsonb by the statement: a Go map
	// has no Postgres type of its own, so pgx could encode it only where
	// the server describes the parameter first (prepared statements), not
	// in QueryExecModeExec or QueryExecModeSimpleProtocol (connection
	// poolers in transaction mode).
	hdr, err := json.Marshal(headers)
	if err != nil { // a map[string]string always marshals
		hdr = []byte("{}")
	}
	return []any{id.Scope, id.MessageID, id.BusinessKey, d.reason,
		clip(d.cause.Error(), q.maxErrorBytes), class, d.sum, d.attempts, clip(d.msg.Topic, 1024), d.msg.Key,
		string(hdr), d.msg.Payload, clip(d.msg.Source, 1024)}
}

// scanDeadLetterID reads dead_letter_insert's row: the new dead letter's
// id, or 0 when the live dead letter exists already.
func scanDeadLetterID(d deadLetterRow, row pgx.Row) (int64, error) {
	var dlID int64
	err := row.Scan(&dlID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("idemq: dead letter %s: %w", d.msg.Identity, err)
	}
	return dlID, nil
}
