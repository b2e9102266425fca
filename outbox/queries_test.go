package outbox

import (
	"strings"
	"testing"
)

// TestStatementsBind fails when a statement the outbox runs is missing from
// sql/*.sql, when one of the file's statements or fragments is used by no
// code, or when a statement refers to a name the outbox does not give
// (duplicated names fail earlier, at package initialization).
func TestStatementsBind(t *testing.T) {
	for _, notify := range []bool{true, false} {
		cfg := Config{Schema: "s_1", Table: "ob", DisableNotify: !notify}.withDefaults()
		q, err := newQueries(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(q.insertSQL, `insert into "s_1"."ob"`) || strings.Contains(q.insertSQL, "pg_notify") != notify {
			t.Errorf("insert with notify %v:\n%s", notify, q.insertSQL)
		}
		if q.listenSQL != `listen "idemq_outbox:s_1.ob"` {
			t.Errorf("listen: %s", q.listenSQL)
		}
	}
}
