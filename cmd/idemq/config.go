package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envAnnotation names, on a flag, the environment variable it falls back to.
const envAnnotation = "idemq_env"

// bindEnv makes flag name fall back to the environment variable env when it
// is not given, and says so in its help.
func bindEnv(fs *pflag.FlagSet, name, env string) {
	f := fs.Lookup(name)
	f.Usage += " (env " + env + ")"
	_ = fs.SetAnnotation(name, envAnnotation, []string{env})
}

// applyEnv sets every flag of cmd that was not given from its environment
// variable, if set. A bad value is a usage error naming the variable.
func (a *app) applyEnv(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		envs := f.Annotations[envAnnotation]
		if err != nil || f.Changed || len(envs) == 0 {
			return
		}
		v := a.getenv(envs[0])
		if v == "" {
			return
		}
		if e := f.Value.Set(v); e != nil {
			err = usagef("%s: invalid value for --%s: %v", envs[0], f.Name, a.redact(e.Error()))
		}
	})
	return err
}

// dbFlags are the database flags: the DSN and the schema of idemq's tables.
type dbFlags struct {
	dsn, schema string
}

func (d *dbFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&d.dsn, "dsn", "", "Postgres connection string (URL or key=value), e.g. postgres://user:password@host:5432/db")
	bindEnv(fs, "dsn", "IDEMQ_DATABASE_URL")
	fs.StringVar(&d.schema, "schema", "idemq", "schema of idemq's tables")
	bindEnv(fs, "schema", "IDEMQ_SCHEMA")
}

// poolConfig checks the DSN (a usage error when missing or malformed) and
// remembers its password for redaction; it does not connect.
func (a *app) poolConfig(d *dbFlags) (*pgxpool.Config, error) {
	if d.dsn == "" {
		return nil, usagef("no database configured: pass --dsn or set IDEMQ_DATABASE_URL")
	}
	if d.schema == "" {
		return nil, usagef("--schema must not be empty")
	}
	cfg, err := pgxpool.ParseConfig(d.dsn)
	if err != nil {
		// pgconn's parse errors redact the password; redact() covers a URL
		// it could not parse as well.
		a.secrets = append(a.secrets, urlPassword(d.dsn))
		return nil, usagef("--dsn: %v", err)
	}
	a.secrets = append(a.secrets, cfg.ConnConfig.Password)
	return cfg, nil
}

// openPool is poolConfig and a pool (pgxpool connects lazily: the first
// query is the first connection).
func (a *app) openPool(ctx context.Context, d *dbFlags) (*pgxpool.Pool, error) {
	cfg, err := a.poolConfig(d)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// redactedDSN is the DSN's host, port, database and user, never its
// password: what logs may show.
func redactedDSN(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	u := url.URL{Scheme: "postgres", Host: fmt.Sprintf("%s:%d", c.Host, c.Port), Path: "/" + c.Database}
	if c.User != "" {
		u.User = url.User(c.User)
		if c.Password != "" {
			u.User = url.UserPassword(c.User, "xxxxx")
		}
	}
	return u.String()
}

// urlPassword is the password of a URL-shaped connection string, or "".
func urlPassword(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return ""
	}
	p, _ := u.User.Password()
	return p
}

// storeFlags name the consumption-record and dead-letter tables, or the
// Redis of a Redis-only store (dedup/redisstore) when withRedis.
type storeFlags struct {
	db                   dbFlags
	records, deadLetters string
	redisURL, prefix     string
	withRedis            bool
	// cmd is the command the flags belong to (to know which were given).
	cmd *cobra.Command
}

func (f *storeFlags) register(cmd *cobra.Command, withRedis bool) {
	fs := cmd.Flags()
	f.cmd, f.withRedis = cmd, withRedis
	f.db.register(fs)
	fs.StringVar(&f.records, "records-table", "consumption_records", "consumption record table")
	fs.StringVar(&f.deadLetters, "dead-letters-table", "dead_letters", "dead-letter table")
	if withRedis {
		fs.StringVar(&f.redisURL, "redis", "", "use a Redis-only store (dedup/redisstore) at this URL, e.g. redis://127.0.0.1:6379/0, instead of Postgres")
		bindEnv(fs, "redis", "IDEMQ_REDIS_URL")
		fs.StringVar(&f.prefix, "redis-prefix", "idemq", "key prefix of the Redis-only store (redisstore.Config.Prefix)")
		bindEnv(fs, "redis-prefix", "IDEMQ_REDIS_PREFIX")
	}
}

// useRedis reports whether the command works on the Redis-only store, and
// refuses an ambiguous configuration: --dsn and --redis both given, or both
// only from the environment.
func (f *storeFlags) useRedis() (bool, error) {
	if f.redisURL == "" {
		return false, nil
	}
	if f.db.dsn == "" {
		return true, nil
	}
	dsnFlag, redisFlag := f.cmd.Flags().Changed("dsn"), f.cmd.Flags().Changed("redis")
	switch {
	case dsnFlag && redisFlag:
		return false, usagef("give --dsn or --redis, not both")
	case redisFlag:
		return true, nil
	case dsnFlag:
		return false, nil
	}
	return false, usagef("both IDEMQ_DATABASE_URL and IDEMQ_REDIS_URL are set: pass --dsn or --redis to choose the store")
}

// check validates the store configuration without connecting: a usage
// error when the database is missing or malformed.
func (a *app) checkStore(f *storeFlags) error {
	isRedis, err := f.useRedis()
	if err != nil {
		return err
	}
	if isRedis {
		opt, err := redis.ParseURL(f.redisURL)
		if err != nil {
			a.secrets = append(a.secrets, urlPassword(f.redisURL))
			return usagef("--redis: %v", err)
		}
		a.secrets = append(a.secrets, opt.Password)
		if f.prefix == "" {
			return usagef("--redis-prefix must not be empty")
		}
		return nil
	}
	if f.records == "" || f.deadLetters == "" {
		return usagef("--records-table and --dead-letters-table must not be empty")
	}
	_, err = a.poolConfig(&f.db)
	return err
}

// errRedisOnly is a usage error for a Postgres-only operation on --redis.
func errRedisOnly(cmd, why string) error {
	return usagef("%s: not for a Redis-only store (--redis): %s", cmd, why)
}

// isUsage reports whether err is a usage error.
func isUsage(err error) bool {
	var ue usageError
	return errors.As(err, &ue)
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
