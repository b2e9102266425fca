package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/spf13/cobra"
)

// deadLetterStore is the dead-letter tooling of both stores, exactly the
// contract's methods (CONTRACT-deadletters.md): what the dead-letters verbs
// call.
type deadLetterStore interface {
	DeadLetter(ctx context.Context, id int64) (dedup.DeadLetter, error)
	ScanDeadLetters(ctx context.Context, f DeadLetterFilter) ([]dedup.DeadLetter, error)
	CountDeadLetters(ctx context.Context, f DeadLetterFilter) (int64, error)
	RedriveDeadLetters(ctx context.Context, f DeadLetterFilter, o RedriveOptions) (RedriveSummary, error)
}

// deadLetterRepublisher is the Postgres store's RepublishDeadLetter.
type deadLetterRepublisher interface {
	RepublishDeadLetter(ctx context.Context, id int64, o RepublishOptions) (RepublishResult, error)
}

// pgDeadLetterPurger is (*pgstore.Store).PurgeDeadLetters.
type pgDeadLetterPurger interface {
	PurgeDeadLetters(ctx context.Context, o pgstore.PurgeOptions) (int64, error)
}

// redisDeadLetterPurger is (*redisstore.Store).PurgeDeadLetters (contract).
type redisDeadLetterPurger interface {
	PurgeDeadLetters(ctx context.Context, olderThan time.Duration) (int64, error)
}

// legacyLister is what the stores list dead letters with before the
// contract's ScanDeadLetters: one scope, or (Postgres) a scope prefix.
type legacyLister interface {
	DeadLetters(ctx context.Context, scope string, afterID int64, limit int) ([]dedup.DeadLetter, error)
}

// prefixLister is the Postgres store's listing by scope prefix.
type prefixLister interface {
	DeadLettersByScopePrefix(ctx context.Context, prefix string, afterID int64, limit int) ([]dedup.DeadLetter, error)
}

// errNoDeadLetterAPI says the store lacks a contract method.
func errNoDeadLetterAPI(method string) error {
	return fmt.Errorf("dead letters: this store has no %s (the dead-letter tooling of dedup is not in this build)", method)
}

// deadLetterJSON is a dead letter in JSON (list, show, export): key and
// payload base64 (the payload left out of list, which gives its size).
type deadLetterJSON struct {
	ID           int64             `json:"id"`
	Scope        string            `json:"scope"`
	MessageID    string            `json:"message_id"`
	BusinessKey  string            `json:"business_key"`
	Reason       string            `json:"reason"`
	Error        string            `json:"error"`
	ErrorClass   string            `json:"error_class"`
	Attempts     int               `json:"attempts"`
	Topic        string            `json:"topic"`
	Key          []byte            `json:"key"`
	Payload      []byte            `json:"payload,omitempty"`
	PayloadBytes int               `json:"payload_bytes"`
	Headers      map[string]string `json:"headers"`
	Source       string            `json:"source"`
	CreatedAt    time.Time         `json:"created_at"`
	RedrivenAt   *time.Time        `json:"redriven_at"`
	RedrivenAs   string            `json:"redriven_as,omitempty"`
}

func toJSON(d dedup.DeadLetter, withPayload bool) deadLetterJSON {
	j := deadLetterJSON{ID: d.ID, Scope: d.Scope, MessageID: d.MessageID, BusinessKey: d.BusinessKey, Reason: d.Reason,
		Error: d.Error, ErrorClass: d.ErrorClass, Attempts: d.Attempts, Topic: d.Topic, Key: d.Key,
		PayloadBytes: len(d.Payload), Headers: d.Headers, Source: d.Source, CreatedAt: d.CreatedAt.UTC(), RedrivenAt: d.RedrivenAt, RedrivenAs: d.RedrivenAs}
	if withPayload {
		j.Payload = d.Payload
	}
	if j.Headers == nil {
		j.Headers = map[string]string{}
	}
	return j
}

// redrivenText is the REDRIVEN column: "true" once the record was re-driven
// in place, "as <derived message ID>" after redrive --as-new.
func redrivenText(d dedup.DeadLetter) string {
	if d.RedrivenAs != "" {
		return "as " + d.RedrivenAs
	}
	return strconv.FormatBool(d.RedrivenAt != nil)
}

// filterFlags are the dead-letter selection flags of list, export and
// redrive.
type filterFlags struct {
	sf                     scopeFlags
	scopePrefix, reason    string
	since, until, redriven string
	afterID                int64
	limit                  int
	withCursor             bool
	cmd                    *cobra.Command
	store                  *storeFlags
}

func (ff *filterFlags) register(cmd *cobra.Command, f *storeFlags, withCursor bool) {
	ff.cmd, ff.store, ff.withCursor = cmd, f, withCursor
	ff.sf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&ff.scopePrefix, "scope-prefix", "", "dead letters of every scope starting with this, e.g. 'http|' for all HTTP requests (Postgres only; not with --scope)")
	fs.StringVar(&ff.reason, "reason", "", "only this reason: "+strings.Join(reasons, ", "))
	fs.StringVar(&ff.since, "since", "", "only dead letters created at or after T: RFC 3339 (2026-12-01T10:00:00Z) or a duration ago (24h)")
	fs.StringVar(&ff.until, "until", "", "only dead letters created before T: RFC 3339 or a duration ago")
	fs.StringVar(&ff.redriven, "redriven", "", "true: only re-driven ones; false: only those not yet re-driven (default both)")
	fs.Int64Var(&ff.afterID, "after-id", 0, "only dead letters with an ID above this (resume a listing)")
	if withCursor {
		fs.IntVar(&ff.limit, "limit", 100, "at most this many dead letters; 1 to 10000")
	}
}

// reasons are the dead-letter reasons --reason accepts.
var reasons = []string{dedup.ReasonMessageIDCollision, dedup.ReasonPayloadConflict,
	dedup.ReasonFingerprintConflict, //nolint:staticcheck // still selects dead letters written before the split
	dedup.ReasonPermanentError, dedup.ReasonAttemptsExhausted, dedup.ReasonBadInput}

// parseWhen reads T: RFC 3339, or a duration ago from now.
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, usagef("--%s %q: want an RFC 3339 time (2026-12-01T10:00:00Z) or a duration ago (24h)", flag, s)
	}
	return now.Add(-d), nil
}

// filter checks the flags and returns the filter (usage errors).
func (ff *filterFlags) filter(now time.Time) (DeadLetterFilter, error) {
	var f DeadLetterFilter
	scope, err := ff.sf.resolve(ff.cmd, ff.store, true)
	if err != nil {
		return f, err
	}
	f.Scope, f.ScopePrefix, f.Reason, f.AfterID = scope, ff.scopePrefix, ff.reason, ff.afterID
	if f.Scope != "" && f.ScopePrefix != "" {
		return f, usagef("%s: give --scope-prefix or a scope (--scope, --http-*), not both", ff.cmd.Name())
	}
	if f.ScopePrefix != "" {
		if isRedis, _ := ff.store.useRedis(); isRedis {
			return f, errRedisOnly(ff.cmd.Name(), "--scope-prefix is Postgres only: give its --scope")
		}
	}
	if f.Reason != "" && !contains(reasons, f.Reason) {
		return f, usagef("--reason %q: want one of %s", f.Reason, strings.Join(reasons, ", "))
	}
	if f.AfterID < 0 {
		return f, usagef("--after-id %d must not be negative", f.AfterID)
	}
	if f.Since, err = parseWhen("since", ff.since, now); err != nil {
		return f, err
	}
	if f.Until, err = parseWhen("until", ff.until, now); err != nil {
		return f, err
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && f.Until.Before(f.Since) {
		return f, usagef("--until %s is before --since %s", f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339))
	}
	if ff.redriven != "" {
		b, err := strconv.ParseBool(ff.redriven)
		if err != nil {
			return f, usagef("--redriven %q: want true or false", ff.redriven)
		}
		f.Redriven = &b
	}
	if ff.withCursor {
		if ff.limit < 1 || ff.limit > 10000 {
			return f, usagef("--limit %d must be 1 to 10000", ff.limit)
		}
		f.Limit = ff.limit
	}
	if err := f.Validate(); err != nil {
		return f, usageError{err}
	}
	return f, nil
}

// selective reports whether f selects less than every dead letter.
func selective(f DeadLetterFilter) bool {
	return f.Scope != "" || f.ScopePrefix != "" || f.Reason != "" || !f.Since.IsZero() || !f.Until.IsZero() || f.Redriven != nil || f.AfterID > 0
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func (a *app) deadLettersCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "dead-letters",
		Aliases: []string{"dl"},
		Short:   "Work with dead letters: list, show, export, redrive, republish, purge",
		Long: `Work with dead letters, in Postgres (--dsn) or a Redis-only store (--redis).

T (--since, --until) is an RFC 3339 time or a duration ago (24h). Every verb
takes the store flags; -o json prints one JSON value on stdout (export: JSON
Lines), progress goes to stderr.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(a.dlListCommand(), a.dlShowCommand(), a.dlExportCommand(), a.dlRedriveCommand(),
		a.dlRepublishCommand(), a.dlPurgeCommand())
	return cmd
}

// openDL checks the store flags and opens the store.
func (a *app) openDL(ctx context.Context, f *storeFlags) (any, func(), error) {
	if err := a.checkStore(f); err != nil {
		return nil, nil, err
	}
	return a.openDeadLetters(ctx, f)
}

// listDeadLetters is one page: ScanDeadLetters, or the older per-scope
// listing for a store without it.
func listDeadLetters(ctx context.Context, st any, f DeadLetterFilter) ([]dedup.DeadLetter, error) {
	if ds, ok := st.(deadLetterStore); ok {
		return ds.ScanDeadLetters(ctx, f)
	}
	if f.Reason != "" || !f.Since.IsZero() || !f.Until.IsZero() || f.Redriven != nil || (f.Scope == "" && f.ScopePrefix == "") {
		return nil, errNoDeadLetterAPI("ScanDeadLetters")
	}
	limit := f.Limit
	if limit == 0 {
		limit = 100
	}
	if f.ScopePrefix != "" {
		pl, ok := st.(prefixLister)
		if !ok {
			return nil, errNoDeadLetterAPI("DeadLettersByScopePrefix")
		}
		return pl.DeadLettersByScopePrefix(ctx, f.ScopePrefix, f.AfterID, limit)
	}
	ll, ok := st.(legacyLister)
	if !ok {
		return nil, errNoDeadLetterAPI("ScanDeadLetters")
	}
	return ll.DeadLetters(ctx, f.Scope, f.AfterID, limit)
}

func (a *app) dlListCommand() *cobra.Command {
	var f storeFlags
	var ff filterFlags
	var out outputFormat
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first, by scope, reason, time and re-drive state",
		Long: `List dead letters in ID order (oldest first), at most --limit; continue with
--after-id set to the last ID. (A Redis-only store numbers IDs per scope:
a page holds every dead letter of its last ID, so it may hold a few more.) The SCOPE column is shown unless one --scope is
given; REDRIVEN is "true" once re-driven in place, "as <message ID>" after a
re-drive as new. -o json gives each dead letter without its payload (see
show and export), with payload_bytes.`,
		Example: `  idemq dead-letters list --scope payments --reason payload_conflict --since 24h
  idemq dead-letters list --scope-prefix 'http|' -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			flt, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			st, closeStore, err := a.openDL(ctx, &f)
			if err != nil {
				return err
			}
			defer closeStore()
			dls, err := listDeadLetters(ctx, st, flt)
			if err != nil {
				return err
			}
			if out == "json" {
				js := make([]deadLetterJSON, 0, len(dls))
				for _, d := range dls {
					js = append(js, toJSON(d, false))
				}
				return writeJSON(a.stdout, js)
			}
			withScope := flt.Scope == ""
			head := "ID\tMESSAGE ID\tBUSINESS KEY\tREASON\tATTEMPTS\tCREATED\tREDRIVEN\tERROR"
			if withScope {
				head = "ID\tSCOPE\tMESSAGE ID\tBUSINESS KEY\tREASON\tATTEMPTS\tCREATED\tREDRIVEN\tERROR"
			}
			t := newTable(a.stdout, head)
			for _, d := range dls {
				scopeCol := ""
				if withScope {
					scopeCol = d.Scope + "\t"
				}
				t.row("%d\t%s%s\t%s\t%s\t%d\t%s\t%s\t%.80s", d.ID, scopeCol, d.MessageID, d.BusinessKey, d.Reason, d.Attempts,
					d.CreatedAt.UTC().Format(time.RFC3339), redrivenText(d), oneLine(d.Error))
			}
			return t.flush()
		},
	}
	f.register(cmd, true)
	ff.register(cmd, &f, true)
	registerOutput(cmd.Flags(), &out)
	return cmd
}

// oneLine keeps a table row on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// decodings are show's --decode values.
var decodings = []string{"auto", "text", "json", "base64", "hex"}

// decodePayload renders p as --decode asks.
func decodePayload(p []byte, how string) (string, error) {
	switch how {
	case "auto":
		if utf8.Valid(p) {
			return string(p), nil
		}
		return base64.StdEncoding.EncodeToString(p), nil
	case "text":
		if !utf8.Valid(p) {
			return "", errors.New("--decode text: the payload is not UTF-8 (use --decode base64 or hex)")
		}
		return string(p), nil
	case "json":
		var buf bytes.Buffer
		if err := json.Indent(&buf, p, "", "  "); err != nil {
			return "", fmt.Errorf("--decode json: the payload is not JSON: %w", err)
		}
		return buf.String(), nil
	case "base64":
		return base64.StdEncoding.EncodeToString(p), nil
	case "hex":
		return hex.EncodeToString(p), nil
	}
	return "", usagef("--decode %q: want one of %s", how, strings.Join(decodings, ", "))
}

// showJSON is show's JSON: the dead letter with its payload (base64) and
// the payload as decoded.
type showJSON struct {
	deadLetterJSON
	Decoding string `json:"decoding"`
	Decoded  string `json:"decoded"`
}

func (a *app) dlShowCommand() *cobra.Command {
	var f storeFlags
	var out outputFormat
	var decode, decodeCmd, scope string
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter: payload, headers, error, attempts, timestamps",
		Long: `Show the dead letter ID (the ID column of list): identity, reason, error and
its class, attempts, topic, key, headers, source, timestamps and re-drive
state, and the payload decoded by --decode (auto: as text when UTF-8, else
base64), or by --decode-cmd, a shell command that gets the payload on stdin
and whose stdout is shown (e.g. 'protoc --decode=Order order.proto').
On a Redis-only store IDs are numbered per scope, so two scopes may share
one: then give --scope.`,
		Example: `  idemq dead-letters show 42 --decode json
  idemq dead-letters show 1764590000123000000 --scope payments --redis redis://localhost:6379/0
  idemq dead-letters show 42 --decode-cmd 'protoc --decode=pay.Order pay.proto' -o json`,
		Args: exactArgs(1, "the dead letter's ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return usagef("dead-letters show: ID %q: want a positive integer (the ID column of dead-letters list)", args[0])
			}
			if !contains(decodings, decode) {
				return usagef("--decode %q: want one of %s", decode, strings.Join(decodings, ", "))
			}
			if decodeCmd != "" && cmd.Flags().Changed("decode") {
				return usagef("give --decode or --decode-cmd, not both")
			}
			ctx := cmd.Context()
			st, closeStore, err := a.openDL(ctx, &f)
			if err != nil {
				return err
			}
			defer closeStore()
			ds, ok := st.(deadLetterStore)
			if !ok {
				return errNoDeadLetterAPI("DeadLetter")
			}
			d, err := showDeadLetter(ctx, ds, id, scope)
			if err != nil {
				if errors.Is(err, dedup.ErrNotFound) {
					return fmt.Errorf("dead letter %d: %w", id, err)
				}
				if isRedis, _ := f.useRedis(); isRedis && scope == "" {
					return fmt.Errorf("%w (if the ID is in several scopes, give --scope)", err)
				}
				return err
			}
			how, decoded := decode, ""
			if decodeCmd != "" {
				how = "cmd"
				decoded, err = runDecoder(ctx, decodeCmd, d.Payload, a.stderr)
			} else {
				decoded, err = decodePayload(d.Payload, decode)
			}
			if err != nil {
				return err
			}
			if out == "json" {
				return writeJSON(a.stdout, showJSON{deadLetterJSON: toJSON(d, true), Decoding: how, Decoded: decoded})
			}
			return a.printDeadLetter(d, how, decoded)
		},
	}
	f.register(cmd, true)
	fs := cmd.Flags()
	fs.StringVar(&decode, "decode", "auto", "how to show the payload: "+strings.Join(decodings, ", "))
	fs.StringVar(&decodeCmd, "decode-cmd", "", "decode the payload with this shell command (payload on its stdin, its stdout shown)")
	fs.StringVar(&scope, "scope", "", "only the dead letter ID of this scope (a Redis-only store numbers IDs per scope: two scopes may share one)")
	registerOutput(fs, &out)
	return cmd
}

// showDeadLetter is the dead letter id, of scope when scope is not "".
func showDeadLetter(ctx context.Context, ds deadLetterStore, id int64, scope string) (dedup.DeadLetter, error) {
	if scope == "" {
		return ds.DeadLetter(ctx, id)
	}
	dls, err := ds.ScanDeadLetters(ctx, DeadLetterFilter{Scope: scope, AfterID: id - 1, Limit: 1})
	if err != nil {
		return dedup.DeadLetter{}, err
	}
	if len(dls) == 0 || dls[0].ID != id {
		return dedup.DeadLetter{}, fmt.Errorf("%w: no dead letter %d in scope %q", dedup.ErrNotFound, id, scope)
	}
	return dls[0], nil
}

// runDecoder pipes payload to sh -c command and returns its stdout.
func runDecoder(ctx context.Context, command string, payload []byte, stderr io.Writer) (string, error) {
	c := exec.CommandContext(ctx, "sh", "-c", command) //nolint:gosec // the operator's own --decode-cmd, run as the operator
	c.Stdin = bytes.NewReader(payload)
	c.Stderr = stderr
	outb, err := c.Output()
	if err != nil {
		return "", fmt.Errorf("--decode-cmd: %w", err)
	}
	return string(outb), nil
}

func (a *app) printDeadLetter(d dedup.DeadLetter, how, decoded string) error {
	t := newTable(a.stdout, "ID\t"+strconv.FormatInt(d.ID, 10))
	t.row("SCOPE\t%s", d.Scope)
	t.row("MESSAGE ID\t%s", d.MessageID)
	t.row("BUSINESS KEY\t%s", d.BusinessKey)
	t.row("REASON\t%s", d.Reason)
	t.row("ERROR\t%s", oneLine(d.Error))
	t.row("ERROR CLASS\t%s", d.ErrorClass)
	t.row("ATTEMPTS\t%d", d.Attempts)
	t.row("TOPIC\t%s", d.Topic)
	t.row("KEY\t%q", d.Key)
	t.row("SOURCE\t%s", d.Source)
	t.row("CREATED\t%s", d.CreatedAt.UTC().Format(time.RFC3339Nano))
	redrivenAt := "-"
	if d.RedrivenAt != nil {
		redrivenAt = d.RedrivenAt.UTC().Format(time.RFC3339Nano)
	}
	t.row("REDRIVEN\t%s", redrivenText(d))
	t.row("REDRIVEN AT\t%s", redrivenAt)
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.row("HEADER %s\t%s", k, d.Headers[k])
	}
	t.row("PAYLOAD\t%d bytes, %s:", len(d.Payload), how)
	if err := t.flush(); err != nil {
		return err
	}
	if !strings.HasSuffix(decoded, "\n") {
		decoded += "\n"
	}
	_, err := io.WriteString(a.stdout, decoded)
	return err
}

func (a *app) dlExportCommand() *cobra.Command {
	var f storeFlags
	var ff filterFlags
	var file string
	var page int
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write dead letters as JSON Lines, one per line (payload base64)",
		Long: `Write the dead letters the filters select as JSON Lines (one JSON object per
line, key and payload base64) to --file, or stdout ('-'), read page by page
(--page rows at a time, so memory stays bounded). A file is created with
mode 0600: payloads may be personal data. The count goes to stderr.
Interrupted, it reports how many it wrote and exits 1 (the file holds
whole lines only).`,
		Example: `  idemq dead-letters export --scope payments --since 168h --file dl.jsonl
  idemq dead-letters export --reason payload_conflict | jq .message_id`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			flt, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			if page < 1 || page > 10000 {
				return usagef("--page %d must be 1 to 10000", page)
			}
			flt.Limit = page
			ctx := cmd.Context()
			st, closeStore, err := a.openDL(ctx, &f)
			if err != nil {
				return err
			}
			defer closeStore()
			if _, ok := st.(deadLetterStore); !ok {
				return errNoDeadLetterAPI("ScanDeadLetters")
			}
			w, closeFile, err := a.exportWriter(file)
			if err != nil {
				return err
			}
			n, err := exportDeadLetters(ctx, st.(deadLetterStore), flt, w)
			if cerr := closeFile(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("export stopped after %d dead letters: %w", n, err)
			}
			_, _ = fmt.Fprintf(a.stderr, "exported %d dead letters to %s\n", n, file)
			return nil
		},
	}
	f.register(cmd, true)
	ff.register(cmd, &f, false)
	cmd.Flags().StringVar(&file, "file", "-", "write to this file ('-': stdout)")
	cmd.Flags().IntVar(&page, "page", 1000, "dead letters read per query; 1 to 10000")
	return cmd
}

// exportWriter opens --file (0600), or stdout for "-".
func (a *app) exportWriter(file string) (io.Writer, func() error, error) {
	if file == "-" || file == "" {
		return a.stdout, func() error { return nil }, nil
	}
	fh, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600) //nolint:gosec // the operator's own --file
	if err != nil {
		return nil, nil, err
	}
	return fh, fh.Close, nil
}

// exportDeadLetters writes every dead letter f selects to w, one JSON line
// each, page by page (f.Limit), and returns how many it wrote.
func exportDeadLetters(ctx context.Context, ds deadLetterStore, f DeadLetterFilter, w io.Writer) (int64, error) {
	enc := json.NewEncoder(w)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		dls, err := ds.ScanDeadLetters(ctx, f)
		if err != nil {
			return n, err
		}
		for _, d := range dls {
			if err := enc.Encode(toJSON(d, true)); err != nil {
				return n, err
			}
			n++
			f.AfterID = d.ID
		}
		if len(dls) < f.Limit {
			return n, nil
		}
	}
}

// redriveJSON is dead-letters redrive's JSON summary. On a dry run
// Redriven is 0 and WouldRedrive is Matched - Skipped.
type redriveJSON struct {
	Matched      int64 `json:"matched"`
	Redriven     int64 `json:"redriven"`
	WouldRedrive int64 `json:"would_redrive,omitempty"`
	Skipped      int64 `json:"skipped"`
	DryRun       bool  `json:"dry_run"`
}

func (a *app) dlRedriveCommand() *cobra.Command {
	var f storeFlags
	var ff filterFlags
	var out outputFormat
	var dryRun, all bool
	var batch int
	var operator string
	cmd := &cobra.Command{
		Use:   "redrive",
		Short: "Re-drive the records of many dead letters by scope, reason or time range",
		Long: `Re-drive (as 'idemq redrive' does for one) the records of every dead letter
the filters select: FAILED_FINAL records become FAILED_RETRYABLE, so their
next delivery runs the handler again. It works in bounded transactions
(--batch), is idempotent (a second run re-drives nothing new) and prints
its progress on stderr and the summary (matched, redriven, skipped) on
stdout. --dry-run changes nothing and prints matched, would redrive and
skipped instead. Without any filter it needs --all.`,
		Example: `  idemq dead-letters redrive --scope payments --reason attempts_exhausted --since 6h --dry-run
  idemq dead-letters redrive --scope payments --since 2026-12-01T08:00:00Z --until 2026-12-01T09:00:00Z`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			flt, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			switch {
			case !selective(flt) && !all:
				return usagef("dead-letters redrive: no filter selects the dead letters: give --scope, --scope-prefix, --reason, --since, --until or --redriven, or --all for every one")
			case selective(flt) && all:
				return usagef("dead-letters redrive: --all is not for filters")
			case batch < 1 || batch > 10000:
				return usagef("--batch %d must be 1 to 10000", batch)
			case len(operator) > 255 || strings.ContainsRune(operator, 0) || !utf8.ValidString(operator):
				return usagef("--operator must be at most 255 bytes of UTF-8 without NUL")
			}
			ctx := cmd.Context()
			st, closeStore, err := a.openDL(ctx, &f)
			if err != nil {
				return err
			}
			defer closeStore()
			ds, ok := st.(deadLetterStore)
			if !ok {
				return errNoDeadLetterAPI("RedriveDeadLetters")
			}
			verb := "done"
			if dryRun {
				verb = "checked (dry run: nothing changed)"
			}
			o := RedriveOptions{DryRun: dryRun, Batch: batch, Operator: operator, Progress: func(done, matched int64) {
				_, _ = fmt.Fprintf(a.stderr, "redrive: %d of %d dead letters %s\n", done, matched, verb)
			}}
			s, err := ds.RedriveDeadLetters(ctx, flt, o)
			if err != nil {
				return fmt.Errorf("dead-letters redrive: %w (so far: %d matched, %d re-driven)", err, s.Matched, s.Redriven)
			}
			if out == "json" {
				js := redriveJSON{Matched: s.Matched, Redriven: s.Redriven, Skipped: s.Skipped, DryRun: dryRun}
				if dryRun {
					js.WouldRedrive = s.Matched - s.Skipped
				}
				return writeJSON(a.stdout, js)
			}
			if dryRun {
				_, err = fmt.Fprintf(a.stdout, "matched %d\nwould redrive %d\nskipped %d (dry run: nothing changed)\n", s.Matched, s.Matched-s.Skipped, s.Skipped)
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "matched %d\nredriven %d\nskipped %d\n", s.Matched, s.Redriven, s.Skipped)
			return err
		},
	}
	f.register(cmd, true)
	ff.register(cmd, &f, false)
	fs := cmd.Flags()
	fs.BoolVar(&dryRun, "dry-run", false, "count what would be re-driven; change nothing")
	fs.BoolVar(&all, "all", false, "re-drive every dead letter (when no filter is given)")
	fs.IntVar(&batch, "batch", 500, "dead letters per transaction; 1 to 10000")
	fs.StringVar(&operator, "operator", os.Getenv("USER"), "who asks, for the audit (default $USER)")
	registerOutput(fs, &out)
	return cmd
}

// republishJSON is dead-letters republish's JSON.
type republishJSON struct {
	DeadLetterID int64  `json:"dead_letter_id"`
	OutboxID     string `json:"outbox_id"`
	MessageID    string `json:"message_id"`
	Already      bool   `json:"already"`
}

func (a *app) dlRepublishCommand() *cobra.Command {
	var f storeFlags
	var out outputFormat
	var topic, table, operator string
	var newID bool
	cmd := &cobra.Command{
		Use:   "republish ID",
		Short: "Send a dead letter to a topic again, through the outbox (Postgres only)",
		Long: `Write the dead letter ID's payload, key and headers as a row of the outbox
table --outbox-table (same database), in one transaction with an audit mark,
exactly once per (dead letter, destination, message-ID choice): a running
relay publishes it. The row goes to --topic (default the dead letter's own
topic) with the dead letter's message ID, or with --new-message-id a derived
one (<message ID>#redrive-<ID>) that the consumer processes as a new
message. Not for a Redis-only store, which has no outbox.`,
		Example: `  idemq dead-letters republish 42 --topic payments.retry --new-message-id`,
		Args:    exactArgs(1, "the dead letter's ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return usagef("dead-letters republish: ID %q: want a positive integer (the ID column of dead-letters list)", args[0])
			}
			if isRedis, err := f.useRedis(); err != nil {
				return err
			} else if isRedis {
				return errRedisOnly("dead-letters republish", "it has no outbox to write the message to (republish from Postgres)")
			}
			if table == "" {
				return usagef("--outbox-table must not be empty")
			}
			if len(operator) > 255 || strings.ContainsRune(operator, 0) || !utf8.ValidString(operator) {
				return usagef("--operator must be at most 255 bytes of UTF-8 without NUL")
			}
			ctx := cmd.Context()
			st, closeStore, err := a.openDL(ctx, &f)
			if err != nil {
				return err
			}
			defer closeStore()
			rp, ok := st.(deadLetterRepublisher)
			if !ok {
				return errNoDeadLetterAPI("RepublishDeadLetter")
			}
			ob, err := a.republishOutbox(st, &f, table)
			if err != nil {
				return err
			}
			res, err := rp.RepublishDeadLetter(ctx, id, RepublishOptions{Topic: topic, NewMessageID: newID, Outbox: ob, Operator: operator})
			if err != nil {
				return err
			}
			if out == "json" {
				return writeJSON(a.stdout, republishJSON{DeadLetterID: id, OutboxID: res.OutboxID, MessageID: res.MessageID, Already: res.Already})
			}
			if res.Already {
				_, err = fmt.Fprintf(a.stdout, "dead letter %d was already republished: outbox row %s, message ID %s (no second row)\n", id, res.OutboxID, res.MessageID)
			} else {
				_, err = fmt.Fprintf(a.stdout, "dead letter %d republished: outbox row %s, message ID %s (a relay publishes it)\n", id, res.OutboxID, res.MessageID)
			}
			return err
		},
	}
	f.register(cmd, true)
	fs := cmd.Flags()
	fs.StringVar(&topic, "topic", "", "destination topic (default the dead letter's own)")
	fs.BoolVar(&newID, "new-message-id", false, "publish under a derived message ID (<message ID>#redrive-<ID>) instead of the dead letter's own")
	fs.StringVar(&table, "outbox-table", "outbox", "the outbox table that receives the row (in --schema)")
	fs.StringVar(&operator, "operator", os.Getenv("USER"), "who asks, for the audit mark (default $USER)")
	registerOutput(fs, &out)
	return cmd
}

// republishOutbox is the outbox of table on the store's pool (nil for the
// unit tests' fake, which has none).
func (a *app) republishOutbox(st any, f *storeFlags, table string) (*outbox.Outbox, error) {
	ps, ok := st.(*pgstore.Store)
	if !ok {
		return nil, nil
	}
	ob, err := outbox.New(ps.Pool(), outbox.Config{Schema: f.db.schema, Table: table})
	if err != nil && errors.Is(err, outbox.ErrInvalidConfig) {
		return nil, usageError{err}
	}
	return ob, err
}

func (a *app) dlPurgeCommand() *cobra.Command {
	var f storeFlags
	var out outputFormat
	var olderThan, every time.Duration
	var batch int
	cmd := &cobra.Command{
		Use:   "purge --older-than D",
		Short: "Delete dead letters older than D",
		Long: `Delete the dead letters created longer ago than --older-than (Postgres: with
their re-drive audit rows, --batch rows per statement, progress on stderr).
Interrupted, it reports how many it deleted and exits 1.`,
		Example: `  idemq dead-letters purge --older-than 720h`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			isRedis, err := f.useRedis()
			switch {
			case err != nil:
				return err
			case !cmd.Flags().Changed("older-than"):
				return usagef("dead-letters purge: --older-than is required (e.g. 720h for 30 days)")
			case olderThan < time.Minute:
				return usagef("--older-than %s must be at least 1m", olderThan)
			case batch < 1 || batch > 100000:
				return usagef("--batch %d must be 1 to 100000", batch)
			case isRedis && cmd.Flags().Changed("batch"):
				return usagef("--batch is for Postgres: the Redis-only store purges by age in one pass")
			case every < 0:
				return usagef("--progress %s must not be negative", every)
			}
			ctx := cmd.Context()
			st, closeStore, err := a.openDL(ctx, &f)
			if err != nil {
				return err
			}
			defer closeStore()
			p := newProgress(a.stderr, every)
			what := fmt.Sprintf("dead letters older than %s", olderThan)
			var n int64
			switch s := st.(type) {
			case pgDeadLetterPurger:
				n, err = s.PurgeDeadLetters(ctx, pgstore.PurgeOptions{Batch: batch, OlderThan: olderThan, Progress: p.step})
			case redisDeadLetterPurger:
				n, err = s.PurgeDeadLetters(ctx, olderThan)
			default:
				return errNoDeadLetterAPI("PurgeDeadLetters")
			}
			return a.purgeDone(ctx, out, "dead-letters purge", what, n, p, err)
		},
	}
	f.register(cmd, true)
	fs := cmd.Flags()
	fs.DurationVar(&olderThan, "older-than", 0, "delete dead letters created longer ago than this (at least 1m); required")
	fs.IntVar(&batch, "batch", pgstore.DefaultPurgeBatch, "Postgres: rows per statement; 1 to 100000")
	fs.DurationVar(&every, "progress", time.Second, "print the rows deleted so far on stderr at most this often")
	registerOutput(fs, &out)
	return cmd
}
