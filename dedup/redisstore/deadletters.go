package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/redis/go-redis/v9"
)

// Dead-letter tooling on Redis, with pgstore.Store's semantics where Redis
// can. Dead letters live in one stream per scope ("…:dead_letters"); a
// filter with a Scope reads that stream, one without finds every scope's
// stream with SCAN (on Redis Cluster, on every primary). A stream entry is
// never updated, so a dead letter's RedrivenAt is derived: it is the
// redriven_ms of its record (written by every re-drive, Redrive or
// RedriveDeadLetters) when that is not before the dead letter's creation,
// i.e. the record was re-driven after this dead letter was written. A
// record that expired takes that knowledge with it (RedrivenAt is nil
// again; re-driving finds no record and skips).

// streamScanChunk is how many stream entries one XRANGE reads while
// filtering.
const streamScanChunk = 1000

// untilSlack widens the stream-ID upper bound of a DeadLetterFilter.Until:
// an entry's ID is never below its created_ms, but may be above it when the
// server clock went back (XADD keeps IDs increasing). Entries are filtered
// on created_ms exactly afterwards.
const untilSlack = time.Minute

// deadLetterStreams returns the dead-letter streams f reads: its scope's, or
// every scope's of this Store's Prefix.
func (s *Store) deadLetterStreams(ctx context.Context, scope string) ([]string, error) {
	if scope != "" {
		return []string{s.keysOf(scope).deadLetters()}, nil
	}
	pattern := globEscape(s.cfg.Prefix) + ":{*}:dead_letters"
	var mu sync.Mutex // ForEachMaster scans the primaries concurrently
	var out []string
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, k := range keys {
				if s.isDeadLetterStream(k) {
					out = append(out, k)
				}
			}
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.c)
	}
	if err != nil {
		return nil, fmt.Errorf("idemq/redisstore: find dead-letter streams: %w", err)
	}
	sort.Strings(out)
	return slices.Compact(out), nil // SCAN may return a key twice
}

// isDeadLetterStream reports whether k is exactly "<Prefix>:{<16 hex>}:dead_letters"
// (SCAN's glob also matches, e.g., a record key whose message ID ends so).
func (s *Store) isDeadLetterStream(k string) bool {
	rest, ok := strings.CutPrefix(k, s.cfg.Prefix+":{")
	if !ok || len(rest) != 16+len("}:dead_letters") || !strings.HasSuffix(rest, "}:dead_letters") {
		return false
	}
	for _, c := range rest[:16] {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// globEscape escapes the SCAN MATCH metacharacters of s.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// dlEntry is a dead letter as read from its stream, with the message ID of
// the record it belongs to (the entry's record field): a delivery matched by
// business key is dead-lettered under its own message ID against the record
// of another.
type dlEntry struct {
	dedup.DeadLetter
	rec string
}

func letters(es []dlEntry) []dedup.DeadLetter {
	out := make([]dedup.DeadLetter, len(es))
	for i, e := range es {
		out[i] = e.DeadLetter
	}
	return out
}

// deadLetterOf reads a stream entry (RedrivenAs and RedrivenAt not set).
func deadLetterOf(e redis.XMessage) dlEntry {
	f := func(k string) string { v, _ := e.Values[k].(string); return v }
	attempts, _ := strconv.Atoi(f("attempts"))
	created, _ := strconv.ParseInt(f("created_ms"), 10, 64)
	d := dedup.DeadLetter{ID: streamID(e.ID), Scope: f("scope"), MessageID: f("message_id"), BusinessKey: f("business_key"),
		Reason: f("reason"), Error: f("error"), ErrorClass: f("error_class"), Attempts: attempts, Topic: f("topic"),
		Key: []byte(f("key")), Payload: []byte(f("payload")), Source: f("source"), CreatedAt: time.UnixMilli(created)}
	if err := json.Unmarshal([]byte(f("headers")), &d.Headers); err != nil {
		d.Headers = nil
	}
	rec := f("record")
	if rec == "" {
		rec = d.MessageID
	}
	return dlEntry{DeadLetter: d, rec: rec}
}

// annotate sets RedrivenAs (the re-drive-as-new audit) and RedrivenAt (the
// record's redriven_ms, see the top of this file) of ds, in one pipeline.
func (s *Store) annotate(ctx context.Context, ds []dlEntry) error {
	if len(ds) == 0 {
		return nil
	}
	pipe := s.c.Pipeline()
	as := make([]*redis.StringCmd, len(ds))
	rs := make([]*redis.StringCmd, len(ds))
	for i, d := range ds {
		k := s.keysOf(d.Scope)
		as[i] = pipe.HGet(ctx, k.redrive(d.ID), "new_message_id")
		rs[i] = pipe.HGet(ctx, k.record(d.rec), "redriven_ms")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	for i := range ds {
		ds[i].RedrivenAs = as[i].Val()
		if ms, err := strconv.ParseInt(rs[i].Val(), 10, 64); err == nil && ms >= ds[i].CreatedAt.UnixMilli() {
			at := time.UnixMilli(ms)
			ds[i].RedrivenAt = &at
		}
	}
	return nil
}

// streamPage reads up to limit dead letters of stream matching f with
// stream ID > after and (when bound > 0) ID <= bound, annotated.
func (s *Store) streamPage(ctx context.Context, stream string, f dedup.DeadLetterFilter, after, bound int64, limit int) ([]dlEntry, error) {
	start := "-"
	if !f.Since.IsZero() && f.Since.UnixMilli() > 0 {
		if since := f.Since.UnixMilli() * 1_000_000; since > after {
			after = since - 1
		}
	}
	if after > 0 {
		start = "(" + entryID(after)
	}
	end := "+"
	if !f.Until.IsZero() {
		if u := (f.Until.Add(untilSlack).UnixMilli()+1)*1_000_000 - 1; u > 0 && (bound == 0 || u < bound) {
			bound = u
		}
	}
	if bound > 0 {
		end = entryID(bound)
	}
	var out []dlEntry
	chunk := max(limit, 1)
	if f.Reason != "" || f.Redriven != nil || !f.Until.IsZero() {
		chunk = max(chunk, streamScanChunk)
	}
	for len(out) < limit {
		entries, err := s.c.XRangeN(ctx, stream, start, end, int64(chunk)).Result()
		if err != nil {
			return nil, fmt.Errorf("idemq/redisstore: dead letters: %w", err)
		}
		ds := make([]dlEntry, len(entries))
		for i, e := range entries {
			ds[i] = deadLetterOf(e)
		}
		if err := s.annotate(ctx, ds); err != nil {
			return nil, fmt.Errorf("idemq/redisstore: dead letters: %w", err)
		}
		for _, d := range ds {
			if f.Match(d.DeadLetter) && len(out) < limit {
				out = append(out, d)
			}
		}
		if len(entries) < chunk {
			break
		}
		start = "(" + entries[len(entries)-1].ID
	}
	return out, nil
}

func (s *Store) checkFilter(f dedup.DeadLetterFilter) error {
	if err := f.Validate(); err != nil {
		return err
	}
	if f.ScopePrefix != "" {
		return fmt.Errorf("%w (%w): DeadLetterFilter.ScopePrefix is not supported by the Redis store (its dead-letter streams are keyed by a digest of the scope): use Scope", ErrInvalidConfig, dedup.ErrInvalidConfig)
	}
	return nil
}

// DeadLetter returns dead letter id, searched in every scope's stream (an
// ID is a stream entry ID, "<ms>-<seq>" as ms·1,000,000+seq), with
// RedrivenAs and RedrivenAt. It returns an error wrapping dedup.ErrNotFound
// when no stream has it (never written, trimmed or purged), and an error
// naming the scopes when two scopes' streams have an entry of that ID (they
// are numbered per stream): read it with ScanDeadLetters and a Scope then.
func (s *Store) DeadLetter(ctx context.Context, id int64) (dedup.DeadLetter, error) {
	if id <= 0 {
		return dedup.DeadLetter{}, fmt.Errorf("%w: no dead letter %d", dedup.ErrNotFound, id)
	}
	streams, err := s.deadLetterStreams(ctx, "")
	if err != nil {
		return dedup.DeadLetter{}, err
	}
	var found []dlEntry
	for _, st := range streams {
		entries, err := s.c.XRangeN(ctx, st, entryID(id), entryID(id), 1).Result()
		if err != nil {
			return dedup.DeadLetter{}, fmt.Errorf("idemq/redisstore: dead letter %d: %w", id, err)
		}
		for _, e := range entries {
			found = append(found, deadLetterOf(e))
		}
	}
	switch len(found) {
	case 0:
		return dedup.DeadLetter{}, fmt.Errorf("%w: no dead letter %d", dedup.ErrNotFound, id)
	case 1:
		if err := s.annotate(ctx, found); err != nil {
			return dedup.DeadLetter{}, fmt.Errorf("idemq/redisstore: dead letter %d: %w", id, err)
		}
		return found[0].DeadLetter, nil
	}
	scopes := make([]string, len(found))
	for i, d := range found {
		scopes[i] = strconv.Quote(d.Scope)
	}
	return dedup.DeadLetter{}, fmt.Errorf("idemq/redisstore: dead letter %d exists in %d scopes (%s): list it with ScanDeadLetters and a Scope", id, len(found), strings.Join(scopes, ", "))
}

// ScanDeadLetters returns up to f.Limit (default 100, at most 10000) dead
// letters with ID > f.AfterID matching f, in ID order (and by scope for
// equal IDs), as pgstore.Store.ScanDeadLetters: a keyset page, pass the
// last ID back as f.AfterID. Since and Until bound the stream range read
// (IDs are creation times). Without a Scope it reads every scope's stream
// (found with SCAN) and merges them; as entry IDs are numbered per stream,
// two scopes may share one, and a page never ends between two dead letters
// of one ID (it ends before them, or, when they alone would fill it, holds
// them all, even beyond f.Limit). Errors: an invalid f (wrapping
// dedup.ErrInvalidConfig, naming the field), a ScopePrefix (wrapping
// dedup.ErrInvalidConfig and this package's ErrInvalidConfig), or Redis's.
func (s *Store) ScanDeadLetters(ctx context.Context, f dedup.DeadLetterFilter) ([]dedup.DeadLetter, error) {
	if err := s.checkFilter(f); err != nil {
		return nil, err
	}
	page, err := s.scanPage(ctx, f, f.AfterID, 0, f.PageSize())
	return letters(page), err
}

func (s *Store) scanPage(ctx context.Context, f dedup.DeadLetterFilter, after, bound int64, limit int) ([]dlEntry, error) {
	streams, err := s.deadLetterStreams(ctx, f.Scope)
	if err != nil {
		return nil, err
	}
	var all []dlEntry
	for _, st := range streams {
		page, err := s.streamPage(ctx, st, f, after, bound, limit)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].ID != all[j].ID {
			return all[i].ID < all[j].ID
		}
		return all[i].Scope < all[j].Scope
	})
	if len(all) <= limit {
		return all, nil
	}
	cut := limit
	if all[cut].ID == all[cut-1].ID {
		tie := all[cut].ID
		for cut > 0 && all[cut-1].ID == tie {
			cut--
		}
		if cut == 0 { // the tie alone fills the page: hold all of it
			for cut < len(all) && all[cut].ID == tie {
				cut++
			}
		}
	}
	return all[:cut], nil
}

// CountDeadLetters counts the dead letters matching f (f.AfterID and f.Limit
// ignored): XLEN per stream for a filter on the scope alone, else a walk of
// the streams' entries in the filter's time range. Errors as
// ScanDeadLetters.
func (s *Store) CountDeadLetters(ctx context.Context, f dedup.DeadLetterFilter) (int64, error) {
	f.AfterID, f.Limit = 0, 0
	if err := s.checkFilter(f); err != nil {
		return 0, err
	}
	streams, err := s.deadLetterStreams(ctx, f.Scope)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, st := range streams {
		if f.Reason == "" && f.Redriven == nil && f.Since.IsZero() && f.Until.IsZero() {
			l, err := s.c.XLen(ctx, st).Result()
			if err != nil {
				return 0, fmt.Errorf("idemq/redisstore: count dead letters: %w", err)
			}
			n += l
			continue
		}
		var after int64
		for {
			page, err := s.streamPage(ctx, st, f, after, 0, streamScanChunk)
			if err != nil {
				return 0, err
			}
			n += int64(len(page))
			if len(page) < streamScanChunk {
				break
			}
			after = page[len(page)-1].ID
		}
	}
	return n, nil
}

// RedriveDeadLetters re-drives the records of the dead letters matching f
// (f.AfterID and f.Limit ignored), as pgstore.Store.RedriveDeadLetters:
// dead letters that have a record of their own (dedup.RedrivableInPlace)
// and are not re-driven yet, walked in ID order up to the moment it
// started, o.Batch (default 500) per step, each step one pipeline of the
// re-drive script (the one Redrive runs, atomic on the server: a record
// still FAILED_FINAL becomes FAILED_RETRYABLE and notes redriven_ms, which
// makes its dead letters read RedrivenAt). Idempotent (a second run
// re-drives nothing: the dead letters read re-driven) and safe when two run
// at once (the script releases a record once; the other run sees it
// FAILED_RETRYABLE and skips it). With o.DryRun nothing changes and Skipped
// counts what would be skipped. It returns the summary so far also with an
// error; an error wrapping dedup.ErrInvalidConfig for an invalid f or o,
// and for a ScopePrefix (wrapping this package's ErrInvalidConfig too).
func (s *Store) RedriveDeadLetters(ctx context.Context, f dedup.DeadLetterFilter, o dedup.RedriveOptions) (dedup.RedriveSummary, error) {
	var sum dedup.RedriveSummary
	f.AfterID, f.Limit = 0, 0
	if err := s.checkFilter(f); err != nil {
		return sum, err
	}
	if err := o.Validate(); err != nil {
		return sum, err
	}
	var matched int64
	if o.Progress != nil {
		n, err := s.CountDeadLetters(ctx, f)
		if err != nil {
			return sum, err
		}
		matched = n
	}
	t, err := s.c.Time(ctx).Result()
	if err != nil {
		return sum, fmt.Errorf("idemq/redisstore: redrive dead letters: %w", err)
	}
	bound := (t.UnixMilli()+1)*1_000_000 - 1 // every entry of the current millisecond
	var after int64
	for {
		if err := ctx.Err(); err != nil {
			return sum, fmt.Errorf("idemq/redisstore: redrive dead letters: %w", err)
		}
		page, err := s.scanPage(ctx, f, after, bound, o.BatchSize())
		if err != nil {
			return sum, err
		}
		if len(page) == 0 {
			return sum, nil
		}
		sum.Matched += int64(len(page))
		after = page[len(page)-1].ID
		type ident struct{ scope, rec string }
		seen := map[ident]bool{}
		var cands []dlEntry
		for _, d := range page {
			id := ident{d.Scope, d.rec}
			if !dedup.RedrivableInPlace(d.Reason) || d.RedrivenAt != nil || seen[id] {
				sum.Skipped++
				continue
			}
			seen[id] = true
			cands = append(cands, d)
		}
		if len(cands) > 0 {
			released, err := s.redriveStep(ctx, cands, o.DryRun)
			if !o.DryRun {
				sum.Redriven += released
			}
			sum.Skipped += int64(len(cands)) - released
			if err != nil {
				return sum, err
			}
		}
		if o.Progress != nil {
			o.Progress(sum.Matched, matched)
		}
	}
}

// redriveStep re-drives (or, on a dry run, checks) the records of ds, one
// per identity, in one pipeline, and returns how many were (would be)
// released.
func (s *Store) redriveStep(ctx context.Context, ds []dlEntry, dry bool) (int64, error) {
	pipe := s.c.Pipeline()
	cmds := make([]func() (string, error), len(ds))
	for i, d := range ds {
		k := s.keysOf(d.Scope)
		rec := k.record(d.rec)
		if dry {
			cmds[i] = pipe.HGet(ctx, rec, "status").Result
			continue
		}
		cmds[i] = redriveScript.Eval(ctx, pipe, []string{rec, k.bkOrRecord(d.BusinessKey, rec)}, ms(s.cfg.FailedRetention), uuid.NewString()).Text
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("idemq/redisstore: redrive dead letters: %w", err)
	}
	var n int64
	for _, c := range cmds {
		if st, err := c(); err == nil && st == string(dedup.StatusFailedFinal) {
			n++
		}
	}
	return n, nil
}

// PurgeDeadLetters deletes the dead letters created more than olderThan ago
// (Redis server time), re-driven or not, from every scope's stream (XTRIM
// MINID, exact), and returns how many it deleted, also with an error. The
// stream keeps trimming itself after Config.FailedRetention; this purges
// sooner. A RedriveAsNew of a purged dead letter finds no dead letter
// (ErrNotFound). It returns an error wrapping ErrInvalidConfig and
// dedup.ErrInvalidConfig when olderThan is under 1m.
func (s *Store) PurgeDeadLetters(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < time.Minute {
		return 0, fmt.Errorf("%w (%w): PurgeDeadLetters olderThan %s must be at least 1m", ErrInvalidConfig, dedup.ErrInvalidConfig, olderThan)
	}
	streams, err := s.deadLetterStreams(ctx, "")
	if err != nil {
		return 0, err
	}
	t, err := s.c.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("idemq/redisstore: purge dead letters: %w", err)
	}
	minID := strconv.FormatInt(t.Add(-olderThan).UnixMilli(), 10)
	var n int64
	for _, st := range streams {
		d, err := s.c.XTrimMinID(ctx, st, minID).Result()
		n += d
		if err != nil {
			return n, fmt.Errorf("idemq/redisstore: purge dead letters: %w", err)
		}
	}
	return n, nil
}
