package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/spf13/pflag"
)

// outputFormat is the value of -o/--output: table (default) or json.
type outputFormat string

func (o *outputFormat) String() string { return string(*o) }
func (o *outputFormat) Type() string   { return "table|json" }
func (o *outputFormat) Set(s string) error {
	switch s {
	case "table", "json":
		*o = outputFormat(s)
		return nil
	}
	return fmt.Errorf("want table or json, got %q", s)
}

// registerOutput adds -o/--output to fs.
func registerOutput(fs *pflag.FlagSet, o *outputFormat) {
	*o = "table"
	fs.VarP(o, "output", "o", "output format: table (for people) or json (one JSON value on stdout; progress and logs stay on stderr)")
}

// writeJSON writes v as one indented JSON value.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes tab-separated rows aligned in columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	_, _ = fmt.Fprintln(t.tw, header)
	return t
}

func (t *table) row(format string, args ...any) { _, _ = fmt.Fprintf(t.tw, format+"\n", args...) }

// flush reports a failed write to the output.
func (t *table) flush() error { return t.tw.Flush() }

// writeObject writes v as one JSON value (json), or as one "field: value"
// line per field of its JSON form, nested objects flattened with dots
// (table).
func writeObject(w io.Writer, o outputFormat, v any) error {
	if o != "table" {
		return writeJSON(w, v)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m any
	if err := dec.Decode(&m); err != nil {
		return err
	}
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	flatten(t, "", m)
	return t.flush()
}

// flatten writes one row per leaf of v, in the JSON object's key order
// (sorted: encoding/json sorts map keys, and struct fields were marshalled
// to a map).
func flatten(t *table, prefix string, v any) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			name := k
			if prefix != "" {
				name = prefix + "." + k
			}
			flatten(t, name, x[k])
		}
	case nil:
		t.row("%s:\t-", prefix)
	case string:
		if x == "" {
			x = "-"
		}
		t.row("%s:\t%s", prefix, x)
	default:
		t.row("%s:\t%v", prefix, x)
	}
}
