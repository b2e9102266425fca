package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The consumption-record commands: migrate, inspect a key, list
// and re-drive dead letters, purge expired records.
func init() {
	commands["migrate"] = runMigrate
	commands["inspect"] = runInspect
	commands["dead-letters"] = runDeadLetters
	commands["redrive"] = runRedrive
	commands["purge"] = runPurge
}

// storeFlags name the consumption-record and dead-letter tables, or the
// Redis of a Redis-only store (dedup/redisstore).
type storeFlags struct {
	db                   dbFlags
	records, deadLetters string
	redisURL, prefix     string
}

func (f *storeFlags) register(fs *flag.FlagSet) {
	f.db.register(fs)
	fs.StringVar(&f.records, "records-table", "consumption_records", "consumption record table")
	fs.StringVar(&f.deadLetters, "dead-letters-table", "dead_letters", "dead-letter table")
	fs.StringVar(&f.redisURL, "redis", "", "use a Redis-only store (dedup/redisstore) at this URL, e.g. redis://127.0.0.1:6379/0, instead of Postgres")
	fs.StringVar(&f.prefix, "redis-prefix", "idemq", "key prefix of the Redis-only store (redisstore.Config.Prefix)")
}

// recordAdmin is what inspect, dead-letters and redrive need; both stores
// have it.
type recordAdmin interface {
	Lookup(ctx context.Context, scope, messageID string) (dedup.Record, error)
	LookupBusinessKey(ctx context.Context, scope, businessKey string) (dedup.Record, error)
	DeadLetters(ctx context.Context, scope string, afterID int64, limit int) ([]dedup.DeadLetter, error)
	Redrive(ctx context.Context, scope, messageID string) error
	RedriveAsNew(ctx context.Context, scope string, deadLetterID int64, opt dedup.RedriveAsNewOptions) (dedup.RedriveAsNewResult, error)
}

// admin opens the store the flags name; closeStore releases it.
func (f *storeFlags) admin(ctx context.Context) (st recordAdmin, closeStore func(), err error) {
	if f.redisURL == "" {
		pool, pst, err := f.open(ctx)
		if err != nil {
			return nil, nil, err
		}
		return pst, pool.Close, nil
	}
	opt, err := redis.ParseURL(f.redisURL)
	if err != nil {
		return nil, nil, fmt.Errorf("-redis: %w", err)
	}
	c := redis.NewClient(opt)
	rst, err := redisstore.New(redisstore.Config{Client: c, Prefix: f.prefix, Fingerprinter: adminFingerprinter()})
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return rst, func() { _ = c.Close() }, nil
}

// adminFingerprinter is a placeholder key: administration never computes a
// fingerprint.
func adminFingerprinter() *dedup.Fingerprinter {
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "cli-admin", Secret: []byte("admin-commands-never-fingerprint")})
	if err != nil {
		panic(err) // a constant key
	}
	return fp
}

// postgresOnly refuses -redis for commands a Redis-only store does not need.
func (f *storeFlags) postgresOnly(cmd string) error {
	if f.redisURL != "" {
		return fmt.Errorf("%s: not for a Redis-only store (-redis): it has no tables, and Redis expires its records itself", cmd)
	}
	return nil
}

// open returns a Store for administration. Administration never computes a
// fingerprint, so the store gets a placeholder key that is never used.
func (f *storeFlags) open(ctx context.Context) (*pgxpool.Pool, *pgstore.Store, error) {
	pool, err := pgxpool.New(ctx, f.db.dsn)
	if err != nil {
		return nil, nil, err
	}
	st, err := pgstore.New(pool, pgstore.Config{Schema: f.db.schema, RecordsTable: f.records, DeadLettersTable: f.deadLetters, Fingerprinter: adminFingerprinter()})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, st, nil
}

func parse(fs *flag.FlagSet, args []string, required map[string]*string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	for name, v := range required {
		if *v == "" {
			return fmt.Errorf("%s: -%s is required", fs.Name(), name)
		}
	}
	return nil
}

func runMigrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	var f storeFlags
	f.register(fs)
	var mf migrateFlags
	mf.register(fs)
	if err := parse(fs, args, nil); err != nil {
		return err
	}
	if err := f.postgresOnly("migrate"); err != nil {
		return err
	}
	if mf.print {
		return printRecordsSQL(os.Stdout, &f)
	}
	pool, st, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if mf.check {
		if err := st.CheckSchema(ctx); err != nil {
			return err
		}
		fmt.Printf("consumption records and dead letters are current in schema %q\n", f.db.schema)
		return nil
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	fmt.Printf("consumption records and dead letters migrated in schema %q\n", f.db.schema)
	return nil
}

func runInspect(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	var f storeFlags
	f.register(fs)
	var sf scopeFlags
	sf.register(fs)
	msgID := fs.String("message-id", "", "message ID, or an HTTP request's Idempotency-Key (or use -business-key)")
	bk := fs.String("business-key", "", "business key")
	showBody := fs.Bool("show-body", false, "HTTP request: also print the stored response body (never a sealed one)")
	if err := parse(fs, args, nil); err != nil {
		return err
	}
	scope, err := sf.resolve(fs, &f, false)
	if err != nil {
		return err
	}
	if (*msgID == "") == (*bk == "") {
		return errors.New("inspect: give exactly one of -message-id and -business-key")
	}
	if *msgID != "" && f.redisURL == "" && isHTTPScope(scope) {
		return inspectHTTP(ctx, &f, scope, *msgID, *showBody)
	}
	st, closeStore, err := f.admin(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	var r dedup.Record
	if *msgID != "" {
		r, err = st.Lookup(ctx, scope, *msgID)
	} else {
		r, err = st.LookupBusinessKey(ctx, scope, *bk)
	}
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func runDeadLetters(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dead-letters", flag.ContinueOnError)
	var f storeFlags
	f.register(fs)
	var sf scopeFlags
	sf.register(fs)
	prefix := fs.String("scope-prefix", "", "list the dead letters of every scope starting with this instead of one -scope, e.g. 'http|' for all HTTP requests (Postgres only)")
	after := fs.Int64("after", 0, "list dead letters with an id above this")
	limit := fs.Int("limit", 100, "at most this many rows")
	if err := parse(fs, args, nil); err != nil {
		return err
	}
	scope, err := sf.resolve(fs, &f, *prefix != "")
	if err != nil {
		return err
	}
	if *prefix != "" && scope != "" {
		return errors.New("dead-letters: give -scope-prefix or a scope (-scope, -http-*), not both")
	}
	st, closeStore, err := f.admin(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	var dls []dedup.DeadLetter
	if *prefix != "" {
		pl, ok := st.(prefixLister)
		if !ok {
			return errors.New("dead-letters: -scope-prefix is not for a Redis-only store (-redis): give its -scope")
		}
		dls, err = pl.DeadLettersByScopePrefix(ctx, *prefix, *after, *limit)
	} else {
		dls, err = st.DeadLetters(ctx, scope, *after, *limit)
	}
	if err != nil {
		return err
	}
	// The tabwriter buffers the rows; Flush reports a failed write to stdout.
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	// REDRIVEN is "true" once the record was re-driven in place (redrive
	// -message-id), or "as <derived message ID>" after redrive -as-new.
	// SCOPE is listed with -scope-prefix only (else it is the one given).
	head, scopeCol := "ID\tMESSAGE ID\tBUSINESS KEY\tREASON\tATTEMPTS\tREDRIVEN\tERROR", ""
	if *prefix != "" {
		head = "ID\tSCOPE\tMESSAGE ID\tBUSINESS KEY\tREASON\tATTEMPTS\tREDRIVEN\tERROR"
	}
	_, _ = fmt.Fprintln(w, head)
	for _, d := range dls {
		redriven := fmt.Sprint(d.RedrivenAt != nil)
		if d.RedrivenAs != "" {
			redriven = "as " + d.RedrivenAs
		}
		if *prefix != "" {
			scopeCol = d.Scope + "\t"
		}
		_, _ = fmt.Fprintf(w, "%d\t%s%s\t%s\t%s\t%d\t%s\t%.80s\n", d.ID, scopeCol, d.MessageID, d.BusinessKey, d.Reason, d.Attempts, redriven, d.Error)
	}
	return w.Flush()
}

func runRedrive(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("redrive", flag.ContinueOnError)
	var f storeFlags
	f.register(fs)
	var sf scopeFlags
	sf.register(fs)
	msgID := fs.String("message-id", "", "message ID (an HTTP request's Idempotency-Key) of the FAILED_FINAL record (not with -as-new)")
	var an asNewFlags
	an.register(fs)
	if err := parse(fs, args, nil); err != nil {
		return err
	}
	scope, err := sf.resolve(fs, &f, false)
	if err != nil {
		return err
	}
	if an.asNew {
		if *msgID != "" {
			return errors.New("redrive: -as-new re-drives one dead letter: give its -id (see idemq dead-letters), not -message-id")
		}
		return an.run(ctx, &f, scope)
	}
	if *msgID == "" {
		return errors.New("redrive: -message-id is required (or -as-new -id N for a conflict's dead letter)")
	}
	st, closeStore, err := f.admin(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	if err := st.Redrive(ctx, scope, *msgID); err != nil {
		return err
	}
	fmt.Printf("%s/%s is FAILED_RETRYABLE: its next delivery runs the handler again\n", scope, *msgID)
	return nil
}
