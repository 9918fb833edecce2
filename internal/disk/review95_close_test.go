package disk

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// WriteAtVec racing Close: no write lands in a file opened after Close
// (which may reuse the descriptor's number), writes after Close fail.
func TestReview95WriteAtVecCloseRace(t *testing.T) {
	dir := t.TempDir()
	for round := 0; round < 50; round++ {
		d, err := OpenFile(filepath.Join(dir, "disk"), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		buf := bytes.Repeat([]byte{0xAB}, 4096)
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				<-start
				for i := 0; i < 200; i++ {
					if _, err := d.WriteAtVec([][]byte{buf[:512], buf, buf}, int64(g)*65536); err != nil {
						return
					}
				}
			}(g)
		}
		close(start)
		d.Close()
		// Likely the closed descriptor's number.
		other := filepath.Join(dir, "other")
		f, err := os.OpenFile(other, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(1 << 20)
		wg.Wait()
		got := make([]byte, 1<<20)
		if _, err := f.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if bytes.IndexByte(got, 0xAB) >= 0 {
			t.Fatalf("round %d: a write to the closed device landed in another file", round)
		}
		if _, err := d.WriteAtVec([][]byte{buf[:512]}, 0); err == nil {
			t.Fatal("a write after Close succeeded")
		}
	}
}
