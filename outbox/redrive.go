package outbox

import (
	"context"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// QualifiedTable returns the outbox table's quoted, schema-qualified name
// (pgx.Identifier{Config.Schema, Config.Table}.Sanitize()), e.g.
// "public"."outbox". It implements pgstore.RepublishOutbox.
func (o *Outbox) QualifiedTable() string {
	return pgx.Identifier{o.cfg.Schema, o.cfg.Table}.Sanitize()
}

// AddRedrive adds a dead letter being republished (pgstore.Store's
// RepublishDeadLetter) as a row in tx, published under m.MessageID
// (Message.MessageID) to m.Topic with m.Key and m.Payload. m.Headers are
// the headers the message was delivered with: the outbox's own message-ID
// header and, unless Config.DisableCausation, its causation header are
// dropped from them (the row sets its own), the rest are kept. It returns
// the row's ID as text, and Add's errors (ErrNilTx, ErrInvalidMessage
// naming the field, the database's). It implements pgstore.RepublishOutbox.
func (o *Outbox) AddRedrive(ctx context.Context, tx pgx.Tx, m dedup.RedriveMessage) (string, error) {
	headers := make(map[string]string, len(m.Headers))
	for k, v := range m.Headers {
		if k == o.cfg.MessageIDHeader || (k == o.cfg.CausationHeader && !o.cfg.DisableCausation) {
			continue
		}
		headers[k] = v
	}
	id, err := o.Add(ctx, tx, Message{Topic: m.Topic, Key: m.Key, Headers: headers, Payload: m.Payload, MessageID: m.MessageID})
	if err != nil {
		return "", err
	}
	return id.String(), nil
}
