package transition

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Defaults of Config.
const (
	// DefaultIDColumn is Config.IDColumn's default.
	DefaultIDColumn = "id"
	// DefaultStatusColumn is Config.StatusColumn's default.
	DefaultStatusColumn = "status"
	// DefaultVersionColumn is Config.VersionColumn's default.
	DefaultVersionColumn = "version"
	// MaxIdentifierBytes is the longest identifier Postgres keeps
	// (NAMEDATALEN − 1); longer ones are refused rather than truncated.
	MaxIdentifierBytes = 63
)

// ErrInvalidConfig is wrapped by New's errors, which name the field.
var ErrInvalidConfig = errors.New("transition: invalid config")

// Rule allows the transition From → To.
type Rule struct {
	// From is the status the row must have.
	From string
	// To is the status it gets.
	To string
}

// Path returns the rules of a chain: Path("PENDING", "PAID", "SHIPPED") is
// PENDING → PAID and PAID → SHIPPED.
func Path(states ...string) []Rule {
	var rules []Rule
	for i := 1; i < len(states); i++ {
		rules = append(rules, Rule{From: states[i-1], To: states[i]})
	}
	return rules
}

// Config configures a Machine (New).
type Config struct {
	// Table is the entity's table, schema-qualified or not
	// (pgx.Identifier{"shop", "orders"}); required, 1 to 3 parts, each 1 to
	// 63 bytes of UTF-8 without NUL.
	Table pgx.Identifier
	// IDColumn is the column Apply's id is compared with. Default
	// DefaultIDColumn ("id"). Give it a unique index (the primary key).
	IDColumn string
	// StatusColumn holds the state (text, varchar or an enum). Default
	// DefaultStatusColumn ("status").
	StatusColumn string
	// VersionColumn is an integer incremented by every applied transition
	// (the optimistic lock; IfVersion compares it). Default
	// DefaultVersionColumn ("version").
	VersionColumn string
	// Returning names extra columns Apply reads back into the destinations
	// given with Into, from the changed row (or, when already applied, the
	// current one). Optional.
	Returning []string
	// Rules are the allowed transitions; required. A state is any
	// non-empty string without surrounding whitespace; a rule from a state
	// to itself is refused (it would make a retry look like a new change),
	// and so is a rule given twice.
	Rules []Rule
	// Entity names the entity in errors and in the entity label of the
	// metrics. Default: the table's last part.
	Entity string
}

func (c Config) withDefaults() Config {
	if c.IDColumn == "" {
		c.IDColumn = DefaultIDColumn
	}
	if c.StatusColumn == "" {
		c.StatusColumn = DefaultStatusColumn
	}
	if c.VersionColumn == "" {
		c.VersionColumn = DefaultVersionColumn
	}
	if c.Entity == "" && len(c.Table) > 0 {
		c.Entity = c.Table[len(c.Table)-1]
	}
	return c
}

// Validate reports the first invalid field of c after defaults, as an error
// wrapping ErrInvalidConfig that names it; nil when New would accept c.
func (c Config) Validate() error {
	return c.withDefaults().validate()
}

func (c Config) validate() error {
	if len(c.Table) == 0 || len(c.Table) > 3 {
		return fmt.Errorf("%w: Table must have 1 to 3 parts, has %d", ErrInvalidConfig, len(c.Table))
	}
	for i, p := range c.Table {
		if err := checkIdent(p); err != nil {
			return fmt.Errorf("%w: Table[%d]: %w", ErrInvalidConfig, i, err)
		}
	}
	cols := map[string]string{}
	for _, f := range []struct{ field, col string }{
		{"IDColumn", c.IDColumn}, {"StatusColumn", c.StatusColumn}, {"VersionColumn", c.VersionColumn},
	} {
		if err := checkIdent(f.col); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalidConfig, f.field, err)
		}
		if prev, ok := cols[f.col]; ok {
			return fmt.Errorf("%w: %s %q is also %s", ErrInvalidConfig, f.field, f.col, prev)
		}
		cols[f.col] = f.field
	}
	for i, col := range c.Returning {
		if err := checkIdent(col); err != nil {
			return fmt.Errorf("%w: Returning[%d]: %w", ErrInvalidConfig, i, err)
		}
	}
	if len(c.Rules) == 0 {
		return fmt.Errorf("%w: Rules: at least one transition is required", ErrInvalidConfig)
	}
	seen := map[Rule]int{}
	for i, r := range c.Rules {
		for _, s := range []struct{ name, v string }{{"From", r.From}, {"To", r.To}} {
			if s.v == "" || strings.TrimSpace(s.v) != s.v {
				return fmt.Errorf("%w: Rules[%d].%s %q must be non-empty without surrounding whitespace", ErrInvalidConfig, i, s.name, s.v)
			}
		}
		if r.From == r.To {
			return fmt.Errorf("%w: Rules[%d] %s → %s: a transition must change the status", ErrInvalidConfig, i, r.From, r.To)
		}
		if j, ok := seen[r]; ok {
			return fmt.Errorf("%w: Rules[%d] %s → %s repeats Rules[%d]", ErrInvalidConfig, i, r.From, r.To, j)
		}
		seen[r] = i
	}
	if c.Entity == "" || len(c.Entity) > 255 || !utf8.ValidString(c.Entity) {
		return fmt.Errorf("%w: Entity %q must be 1 to 255 bytes of UTF-8", ErrInvalidConfig, c.Entity)
	}
	return nil
}

func checkIdent(s string) error {
	switch {
	case s == "":
		return errors.New("empty identifier")
	case len(s) > MaxIdentifierBytes:
		return fmt.Errorf("identifier %q is longer than %d bytes", s, MaxIdentifierBytes)
	case !utf8.ValidString(s) || strings.ContainsRune(s, 0):
		return fmt.Errorf("identifier %q is not UTF-8 without NUL", s)
	}
	return nil
}
