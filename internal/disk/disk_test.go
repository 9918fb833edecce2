package disk

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
)

func testFS(t *testing.T, d FS, dir string) {
	p := filepath.Join(dir, "f")
	if _, err := d.ReadFile(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	for _, v := range []string{"one", "two"} {
		if err := d.WriteFileSync(p, []byte(v)); err != nil {
			t.Fatal(err)
		}
		if b, err := d.ReadFile(p); err != nil || string(b) != v {
			t.Fatalf("read back %q, %v; want %q", b, err, v)
		}
	}
}

func TestOS(t *testing.T)  { testFS(t, OS{}, t.TempDir()) }
func TestMem(t *testing.T) { testFS(t, NewMem(), "/x") }

func TestMemFailWrites(t *testing.T) {
	m := NewMem()
	m.WriteFileSync("/a", []byte("old"))
	m.FailWrites(ErrFull)
	if err := m.WriteFileSync("/a", []byte("new")); !errors.Is(err, ErrFull) {
		t.Fatalf("write on a full disk: %v", err)
	}
	if b, _ := m.ReadFile("/a"); string(b) != "old" {
		t.Fatalf("failed write changed the file: %q", b)
	}
}
