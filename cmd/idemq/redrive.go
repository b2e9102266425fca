package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/wire"
	"github.com/spf13/cobra"
)

// asNewFlags are redrive's flags for re-driving a conflict's dead letter as
// a new message (Store.RedriveAsNew): the dead letter, the override for
// payload conflicts, and the broker the message is published to.
type asNewFlags struct {
	asNew, force bool
	id           int64
	operator     string
	header       string
	broker       brokerFlags
	cmd          *cobra.Command
}

func (an *asNewFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	an.cmd = cmd
	fs.BoolVar(&an.asNew, "as-new", false, "re-drive the conflict's dead letter --id as a new message: publish it under the message ID <message ID>#redrive-<id>")
	fs.Int64Var(&an.id, "id", 0, "--as-new: the dead letter's ID (the ID column of idemq dead-letters list)")
	fs.BoolVar(&an.force, "force", false, "--as-new: also re-drive a payload conflict (one intent sent with two payloads; the record usually stands for the right one)")
	fs.StringVar(&an.operator, "operator", os.Getenv("USER"), "--as-new: who asks, for the audit row (default $USER)")
	fs.StringVar(&an.header, "message-id-header", wire.MessageIDHeader, "--as-new: the message-ID header (Kafka) or property (RocketMQ) the consumer reads")
	an.broker.register(fs, false)
}

// check validates the --as-new flags (usage errors).
func (an *asNewFlags) check(a *app) error {
	switch {
	case an.id <= 0:
		return usagef("redrive --as-new: --id of the dead letter is required (see idemq dead-letters list)")
	case an.header == "":
		return usagef("redrive --as-new: --message-id-header must not be empty")
	}
	return an.broker.check(a)
}

// redriveAsNew re-drives dead letter an.id of scope as a new message and
// prints what happened: published now, or already published by an earlier
// run.
func (a *app) redriveAsNew(ctx context.Context, an *asNewFlags, f *storeFlags, scope string) error {
	publish, closePub := an.publisher()
	defer closePub()
	st, closeStore, err := a.admin(ctx, f)
	if err != nil {
		return err
	}
	defer closeStore()
	res, err := st.RedriveAsNew(ctx, scope, an.id, dedup.RedriveAsNewOptions{Publish: publish, Force: an.force, Operator: an.operator})
	if err != nil {
		if errors.Is(err, dedup.ErrPayloadConflict) && !an.force {
			err = fmt.Errorf("%w\n(pass --force to re-drive it anyway)", err)
		}
		return err
	}
	d := res.DeadLetter
	if !res.Published {
		_, err = fmt.Fprintf(a.stdout, "dead letter %d (%s) was already re-driven as %s at %s: nothing new published\n",
			d.ID, d.Reason, res.MessageID, res.PublishedAt.Format(time.RFC3339))
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "dead letter %d (%s) re-driven as new: published to %s as message ID %s; the consumer of scope %s processes it under that identity (the record %s keeps its own)\n",
		d.ID, d.Reason, d.Topic, res.MessageID, scope, d.MessageID)
	return err
}

// publisher returns the Publish function of RedriveAsNew: one envelope,
// published with the outbox's publishers (Kafka acks=all, RocketMQ
// SendSync), so the call returns only once the broker stored it. The
// publisher is made at the first publish (a refused or already done
// re-drive connects to no broker); closePub releases it.
func (an *asNewFlags) publisher() (publish func(context.Context, dedup.RedriveMessage) error, closePub func()) {
	var pub closingPublisher
	publish = func(ctx context.Context, m dedup.RedriveMessage) error {
		if pub == nil {
			p, err := an.broker.publisher()
			if err != nil {
				return err
			}
			pub = p
		}
		return pub.Publish(ctx, []outbox.Envelope{republishEnvelope(an.broker.broker, an.header, m)})
	}
	closePub = func() {
		if pub != nil {
			_ = pub.Close()
		}
	}
	return publish, closePub
}

// republishEnvelope is the message RedriveAsNew publishes: the dead letter's
// topic, key, payload and headers (for RocketMQ its user properties only,
// without the stored copy's UNIQ_KEY, offsets and retry topic), with header
// set to the derived message ID.
func republishEnvelope(broker, header string, m dedup.RedriveMessage) outbox.Envelope {
	h := m.Headers
	if broker == "rocketmq" {
		h = rocketmqadapter.UserProperties(h)
	}
	headers := make(map[string]string, len(h)+1)
	for k, v := range h {
		headers[k] = v
	}
	headers[header] = m.MessageID
	var key []byte
	if len(m.Key) > 0 {
		key = m.Key
	}
	id, err := uuid.NewV7()
	if err != nil {
		id = uuid.New() // only names the envelope in publish errors
	}
	return outbox.Envelope{ID: id, Topic: m.Topic, Key: key, Headers: headers, Payload: m.Payload}
}
