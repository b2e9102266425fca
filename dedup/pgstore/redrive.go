package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// RedriveAsNew re-drives dead letter deadLetterID of scope as a new message:
// it writes an audit row (table <DeadLettersTable>_redrives, one row per dead
// letter), then publishes the message through opt.Publish under the derived
// message ID RedriveAsNewID(message ID, deadLetterID), then stamps the audit
// row published. The consumer then processes it as a message of its own; the
// record the dead letter collided with is left as it is. See the comment at
// the top of this file for why each step is safe to repeat.
//
// Only conflicts can be re-driven as new (RedrivableAsNew): message-ID
// collisions always, payload conflicts only with opt.Force. Errors:
// ErrNotFound (no dead letter deadLetterID in scope), ErrPayloadConflict
// (refused; the error says why), ErrNotAConflict, ErrInvalidConfig (no
// Publish, bad Operator), or the publish's error, wrapped (the audit row is
// kept unpublished: call again to publish).
func (s *Store) RedriveAsNew(ctx context.Context, scope string, deadLetterID int64, opt dedup.RedriveAsNewOptions) (dedup.RedriveAsNewResult, error) {
	if err := opt.Validate(); err != nil {
		return dedup.RedriveAsNewResult{}, err
	}
	var res dedup.RedriveAsNewResult
	var auditID int64
	var publishedAt *time.Time
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// FOR UPDATE serializes two operators re-driving the same dead letter.
		d, err := s.deadLetter(ctx, tx, scope, deadLetterID)
		if err != nil {
			return err
		}
		res.DeadLetter = d
		if err := dedup.RedrivableAsNew(d.Reason, opt.Force); err != nil {
			return err
		}
		if d.Reason != dedup.ReasonMessageIDCollision && d.BusinessKey != "" {
			var holder string
			err := tx.QueryRow(ctx, s.q.businessKeyHolderSQL, scope, d.BusinessKey).Scan(&holder)
			if err == nil {
				return fmt.Errorf("%w: business key %q has record %s/%s: a re-driven copy would match it and conflict again", dedup.ErrPayloadConflict, d.BusinessKey, scope, holder)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("idemq: redrive as new: %w", err)
			}
		}
		res.MessageID = dedup.RedriveAsNewID(d.MessageID, d.ID)
		err = tx.QueryRow(ctx, s.q.redriveAuditInsertSQL, d.ID, scope, d.MessageID, res.MessageID, d.BusinessKey, d.Reason, opt.Force, opt.Operator).
			Scan(&auditID, &res.RequestedAt)
		if err == nil {
			res.Created = true
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("idemq: redrive as new: audit: %w", err)
		}
		err = tx.QueryRow(ctx, s.q.redriveAuditGetSQL, d.ID).
			Scan(&auditID, &res.MessageID, &res.RequestedAt, &publishedAt)
		if err != nil {
			return fmt.Errorf("idemq: redrive as new: audit: %w", err)
		}
		return nil
	})
	if err != nil {
		return dedup.RedriveAsNewResult{}, err
	}
	if publishedAt != nil {
		res.PublishedAt = *publishedAt
		return res, nil // published by an earlier call: nothing new
	}
	d := res.DeadLetter
	if err := opt.Publish(ctx, dedup.RedriveMessage{MessageID: res.MessageID, Topic: d.Topic, Key: d.Key, Headers: d.Headers,
		Payload: d.Payload, DeadLetterID: d.ID}); err != nil {
		return res, fmt.Errorf("idemq: redrive as new: publish %s (audit row kept; call again to publish): %w", res.MessageID, err)
	}
	res.Published = true
	err = s.pool.QueryRow(context.WithoutCancel(ctx), s.q.redriveAuditPublishedSQL, auditID).Scan(&res.PublishedAt)
	if err != nil {
		return res, fmt.Errorf("idemq: redrive as new: %s published, but stamping its audit row failed (a repeated call publishes a copy, which dedup drops): %w", res.MessageID, err)
	}
	return res, nil
}

// deadLetter reads and locks one dead letter of scope, or ErrNotFound.
func (s *Store) deadLetter(ctx context.Context, tx pgx.Tx, scope string, id int64) (dedup.DeadLetter, error) {
	var d dedup.DeadLetter
	err := tx.QueryRow(ctx, s.q.deadLetterLockSQL, id, scope).
		Scan(&d.ID, &d.Scope, &d.MessageID, &d.BusinessKey, &d.Reason, &d.Error, &d.ErrorClass, &d.Attempts,
			&d.Topic, &d.Key, &d.Payload, &d.Headers, &d.Source, &d.CreatedAt, &d.RedrivenAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return dedup.DeadLetter{}, fmt.Errorf("%w: no dead letter %d in scope %q", dedup.ErrNotFound, id, scope)
	}
	if err != nil {
		return dedup.DeadLetter{}, fmt.Errorf("idemq: dead letter %d: %w", id, err)
	}
	return d, nil
}
