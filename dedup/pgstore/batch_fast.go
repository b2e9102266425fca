package pgstore

import (
	"context"
	"errors"

	"github.com/idemq/idemq/dedup"
)

// fastLookupBatch asks the fast path about every message of a batch that
// has a fingerprint, before any transaction: one call when it is a
// dedup.BatchFastPath, else one Lookup per message. It returns the
// duplicate's result of each hit (hit[i] true) — a hit only when the
// remembered fingerprint matches the delivery's, as in fastLookup. Hits,
// misses and errors are counted per message (FastPathStats). Without a fast
// path, or on a batch lookup error, hit is all false: Postgres answers.
func (s *Store) fastLookupBatch(ctx context.Context, msgs []*dedup.Message, fps []batchFP) (results []dedup.Result, hit []bool) {
	if s.cfg.FastPath == nil {
		return nil, nil
	}
	results, hit = make([]dedup.Result, len(msgs)), make([]bool, len(msgs))
	bf, ok := s.cfg.FastPath.(dedup.BatchFastPath)
	if !ok {
		for i, m := range msgs {
			if fps[i].err == nil {
				results[i], hit[i] = s.fastLookup(ctx, m)
			}
		}
		return results, hit
	}
	idx := make([]int, 0, len(msgs))
	ids := make([]dedup.Identity, 0, len(msgs))
	for i, m := range msgs {
		if fps[i].err == nil {
			idx = append(idx, i)
			ids = append(ids, m.Identity)
		}
	}
	if len(ids) == 0 {
		return results, hit
	}
	found, err := bf.LookupBatch(ctx, ids)
	if err == nil && len(found) != len(ids) {
		err = errors.New("idemq: fast path LookupBatch returned a wrong number of answers")
	}
	if err != nil {
		s.fast.errors.Add(int64(len(ids)))
		if !errors.Is(err, dedup.ErrFastPathSkipped) {
			s.cfg.Logger.DebugContext(ctx, "idemq: fast path batch lookup failed; using Postgres", "messages", len(ids), "err", err)
		}
		return results, hit
	}
	for k, i := range idx {
		f := found[k]
		if f.OK {
			if same, ferr := s.fp.Matches(msgs[i].Payload, f.Entry.Fingerprint, f.Entry.KeyID); ferr == nil && same {
				s.fast.hits.Add(1)
				results[i] = dedup.Result{Outcome: dedup.OutcomeDuplicate, MatchedBy: f.Entry.MatchedBy, Status: dedup.StatusSucceeded}
				hit[i] = true
				continue
			}
		}
		s.fast.misses.Add(1)
	}
	return results, hit
}

// mergeFastHits puts the fast path's answers (fast[i] where hit[i]) and
// Postgres's answers of the other messages (sub, in order) together. Order
// holds as in a batch without a fast path: after the first message that was
// not answered for good (OutcomeRetry, or left unattempted) every later
// result is left zero, fast hits included.
func mergeFastHits(fast []dedup.Result, hit []bool, sub []dedup.Result) []dedup.Result {
	out := make([]dedup.Result, len(hit))
	k, stopped := 0, false
	for i := range hit {
		if hit[i] {
			if !stopped {
				out[i] = fast[i]
			}
			continue
		}
		if !stopped {
			out[i] = sub[k]
			stopped = sub[k].Outcome == "" || sub[k].Outcome == dedup.OutcomeRetry
		}
		k++
	}
	return out
}

// processBatchFast is ProcessBatch with a fast path: the hits are answered
// without Postgres, and the misses (in order) go through processBatchPG; a
// batch of hits only opens no transaction. On an error nothing is durable
// (as for processBatchPG): the results only say which handlers ran.
func (s *Store) processBatchFast(ctx context.Context, msgs []*dedup.Message, fps []batchFP, w batchWork) ([]dedup.Result, error) {
	fast, hit := s.fastLookupBatch(ctx, msgs, fps)
	subMsgs := make([]*dedup.Message, 0, len(msgs))
	subFPs := make([]batchFP, 0, len(msgs))
	for i, m := range msgs {
		if !hit[i] {
			subMsgs, subFPs = append(subMsgs, m), append(subFPs, fps[i])
		}
	}
	if len(subMsgs) == len(msgs) {
		return s.processBatchPG(ctx, msgs, fps, w)
	}
	var sub []dedup.Result
	if len(subMsgs) > 0 {
		var err error
		if sub, err = s.processBatchPG(ctx, subMsgs, subFPs, w); err != nil {
			out := make([]dedup.Result, len(msgs))
			k := 0
			for i := range msgs {
				if !hit[i] {
					if k < len(sub) {
						out[i].HandlerCalled = sub[k].HandlerCalled
					}
					k++
				}
			}
			return out, err
		}
	}
	return mergeFastHits(fast, hit, sub), nil
}

// fastRememberBatch remembers, after the batch's commit, every message that
// came out SUCCEEDED (processed, or a duplicate of a succeeded record): in
// one call when the fast path is a dedup.BatchFastPath, else one Remember
// each. Failures are only counted (one error per message) and logged at
// debug level, as fastRemember's.
func (s *Store) fastRememberBatch(ctx context.Context, msgs []*dedup.Message, fps []batchFP, results []dedup.Result) {
	if s.cfg.FastPath == nil {
		return
	}
	bf, batched := s.cfg.FastPath.(dedup.BatchFastPath)
	var ids []dedup.Identity
	var entries []dedup.FastPathEntry
	for i, r := range results {
		if r.Status != dedup.StatusSucceeded || (r.Outcome != dedup.OutcomeProcessed && r.Outcome != dedup.OutcomeDuplicate) || fps[i].err != nil {
			continue
		}
		if !batched {
			s.fastRemember(ctx, msgs[i].Identity, fps[i].sum, fps[i].keyID)
			continue
		}
		ids = append(ids, msgs[i].Identity)
		entries = append(entries, dedup.FastPathEntry{Fingerprint: fps[i].sum, KeyID: fps[i].keyID})
	}
	if len(ids) == 0 {
		return
	}
	if err := bf.RememberBatch(context.WithoutCancel(ctx), ids, entries); err != nil {
		s.fast.errors.Add(int64(len(ids)))
		if !errors.Is(err, dedup.ErrFastPathSkipped) {
			s.cfg.Logger.DebugContext(ctx, "idemq: fast path batch remember failed", "messages", len(ids), "err", err)
		}
	}
}
