package namedsql

import (
	"strings"
	"testing"
	"testing/fstest"
)

const good = `-- The file's own comment.
-- fragment: match
select id from {{.t}} where k = $1

-- name: get
-- A comment kept out of the SQL.
select * from {{.t}}
where id = ({{template "match" .}});

-- name: put
insert into {{.t}} values ($1)
`

func TestBind(t *testing.T) {
	s, err := Parse("good.sql", good)
	if err != nil {
		t.Fatal(err)
	}
	var get, put string
	if err := s.Bind(map[string]any{"t": `"s"."t"`}, map[string]*string{"get": &get, "put": &put}); err != nil {
		t.Fatal(err)
	}
	if want := "select * from \"s\".\"t\"\nwhere id = (select id from \"s\".\"t\" where k = $1)"; get != want {
		t.Errorf("get = %q, want %q", get, want)
	}
	if want := `insert into "s"."t" values ($1)`; put != want {
		t.Errorf("put = %q, want %q", put, want)
	}
	if got := strings.Join(s.Names(), ","); got != "get,put" {
		t.Errorf("Names() = %s", got)
	}
}

func TestBindRefuses(t *testing.T) {
	s, err := Parse("good.sql", good)
	if err != nil {
		t.Fatal(err)
	}
	var a, b, c string
	data := map[string]any{"t": "t"}
	for _, tc := range []struct {
		name string
		dst  map[string]*string
		data any
		want string
	}{
		{"missing", map[string]*string{"get": &a, "put": &b, "gone": &c}, data, "no statement named gone"},
		{"fragment as statement", map[string]*string{"get": &a, "put": &b, "match": &c}, data, "no statement named match"},
		{"unused", map[string]*string{"get": &a}, data, "used by no code: put"},
		{"missing key", map[string]*string{"get": &a, "put": &b}, map[string]any{}, "map has no entry for key"},
	} {
		err := s.Bind(tc.data, tc.dst)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Bind = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	// A fragment no statement includes is unused too.
	s2, err := Parse("f.sql", "-- fragment: lonely\nselect 1\n-- name: q\nselect 2\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Bind(nil, map[string]*string{"q": &a}); err == nil || !strings.Contains(err.Error(), "lonely (fragment)") {
		t.Errorf("unused fragment: Bind = %v", err)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"select 1\n-- name: a\nselect 1\n", "SQL before the first"},
		{"-- just a comment\n", "no \"-- name:\" block"},
		{"-- name: a\nselect 1\n-- name: a\nselect 2\n", `"a" is defined twice`},
		{"-- name: Bad-Name\nselect 1\n", "must match"},
		{"-- name: a\n-- only a comment\n", `"a" has no SQL`},
		{"-- name: a\nselect {{.x\n", `"a"`},
	} {
		if _, err := Parse("f.sql", tc.src); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tc.src, err, tc.want)
		}
	}
	// A name defined in two files of one Set is a duplicate too.
	fsys := fstest.MapFS{
		"sql/a.sql": {Data: []byte("-- name: x\nselect 1\n")},
		"sql/b.sql": {Data: []byte("-- name: x\nselect 2\n")},
	}
	if _, err := ParseFS(fsys, "sql/*.sql"); err == nil || !strings.Contains(err.Error(), "sql/b.sql:1: \"x\" is defined twice") {
		t.Errorf("ParseFS with a name in two files = %v", err)
	}
	if _, err := ParseFS(fsys, "none/*.sql"); err == nil {
		t.Error("ParseFS with no file matched: no error")
	}
}
