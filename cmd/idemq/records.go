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
	"github.com/jackc/pgx/v5/pgxpool"
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

// storeFlags name the consumption-record and dead-letter tables.
type storeFlags struct {
	db                   dbFlags
	records, deadLetters string
}

func (f *storeFlags) register(fs *flag.FlagSet) {
	f.db.register(fs)
	fs.StringVar(&f.records, "records-table", "consumption_records", "consumption record table")
	fs.StringVar(&f.deadLetters, "dead-letters-table", "dead_letters", "dead-letter table")
}

// open returns a Store for administration. Administration never computes a
// fingerprint, so the store gets a placeholder key that is never used.
func (f *storeFlags) open(ctx context.Context) (*pgxpool.Pool, *dedup.Store, error) {
	pool, err := pgxpool.New(ctx, f.db.dsn)
	if err != nil {
		return nil, nil, err
	}
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "cli-admin", Secret: []byte("admin-commands-never-fingerprint")})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	st, err := dedup.NewStore(pool, dedup.Config{Schema: f.db.schema, RecordsTable: f.records, DeadLettersTable: f.deadLetters, Fingerprinter: fp})
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
	if err := parse(fs, args, nil); err != nil {
		return err
	}
	pool, st, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
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
	scope := fs.String("scope", "", "scope (consumer group)")
	msgID := fs.String("message-id", "", "message ID (or use -business-key)")
	bk := fs.String("business-key", "", "business key")
	if err := parse(fs, args, map[string]*string{"scope": scope}); err != nil {
		return err
	}
	if (*msgID == "") == (*bk == "") {
		return errors.New("inspect: give exactly one of -message-id and -business-key")
	}
	pool, st, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var r dedup.Record
	if *msgID != "" {
		r, err = st.Lookup(ctx, *scope, *msgID)
	} else {
		r, err = st.LookupBusinessKey(ctx, *scope, *bk)
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
	scope := fs.String("scope", "", "scope (consumer group)")
	after := fs.Int64("after", 0, "list dead letters with an id above this")
	limit := fs.Int("limit", 100, "at most this many rows")
	if err := parse(fs, args, map[string]*string{"scope": scope}); err != nil {
		return err
	}
	pool, st, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	dls, err := st.DeadLetters(ctx, *scope, *after, *limit)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tMESSAGE ID\tBUSINESS KEY\tREASON\tATTEMPTS\tREDRIVEN\tERROR")
	for _, d := range dls {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%v\t%.80s\n", d.ID, d.MessageID, d.BusinessKey, d.Reason, d.Attempts, d.RedrivenAt != nil, d.Error)
	}
	return w.Flush()
}

func runRedrive(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("redrive", flag.ContinueOnError)
	var f storeFlags
	f.register(fs)
	scope := fs.String("scope", "", "scope (consumer group)")
	msgID := fs.String("message-id", "", "message ID of the FAILED_FINAL record")
	if err := parse(fs, args, map[string]*string{"scope": scope, "message-id": msgID}); err != nil {
		return err
	}
	pool, st, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := st.Redrive(ctx, *scope, *msgID); err != nil {
		return err
	}
	fmt.Printf("%s/%s is FAILED_RETRYABLE: its next delivery runs the handler again\n", *scope, *msgID)
	return nil
}

func runPurge(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("purge", flag.ContinueOnError)
	var f storeFlags
	f.register(fs)
	batch := fs.Int("batch", 1000, "rows deleted per statement")
	if err := parse(fs, args, nil); err != nil {
		return err
	}
	pool, st, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := st.Purge(ctx, *batch)
	if err != nil {
		return err
	}
	fmt.Printf("purged %d expired records\n", n)
	return nil
}
