package fd

import (
	"maps"
	"testing"

	"github.com/grovestore/grove/internal/disk"
)

// FuzzPersistedState: the failure detector's files on a node's disk (its
// last incarnation, the durable verdicts it has given). Whatever they
// hold, reading them never panics: a corrupt file is an error naming it
// (the node does not start, rather than reuse an incarnation or forget a
// verdict); what reads is saved and read back unchanged.
func FuzzPersistedState(f *testing.F) {
	f.Add([]byte("7\n"))
	f.Add([]byte(`{"1":3,"2":9}`))
	f.Add([]byte(""))
	f.Add([]byte("18446744073709551615"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d := disk.NewMem()
		if err := d.WriteFileSync("/f", b); err != nil {
			t.Fatal(err)
		}
		if inc, err := LoadIncarnation(d, "/f"); err == nil {
			if err := SaveIncarnation(d, "/g", inc); err != nil {
				t.Fatal(err)
			}
			if again, err := LoadIncarnation(d, "/g"); err != nil || again != inc {
				t.Fatalf("incarnation %d saved and read back: %d, %v", inc, again, err)
			}
		}
		if m, err := loadTombstones(d, "/f"); err == nil {
			if err := saveTombstones(d, "/h", m); err != nil {
				t.Fatal(err)
			}
			again, err := loadTombstones(d, "/h")
			if err != nil || !maps.Equal(again, m) && !(len(m) == 0 && len(again) == 0) {
				t.Fatalf("verdicts %v saved and read back: %v, %v", m, again, err)
			}
		}
	})
}
