package disk

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// WriteAtVec writes what WriteAt of the concatenation writes, wherever its
// buffers' edges fall against WriteChunk's pieces and however many there
// are (more than one pwritev's IOV_MAX): random buffer lists, RLDev-like
// ones (512-byte headers and 4 KiB data, up to 2 MiB) among them, on a
// buffered device and, where the file system allows it, a direct one;
// both devices read back against a model. GROVE_SEED replays.
func TestFileDeviceWriteAtVec(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("GROVE_SEED"); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (GROVE_SEED replays)", seed)
	rng := rand.New(rand.NewSource(seed))
	const size = 8 << 20
	for _, direct := range []bool{false, true} {
		d, err := OpenFileWith(filepath.Join(t.TempDir(), "disk"), size, FileOptions{DirectWrites: direct})
		if err != nil {
			t.Fatal(err)
		}
		if direct && !d.Direct() {
			t.Log("no direct writes on this file system")
			d.Close()
			continue
		}
		if d.WritesVec() == direct {
			t.Fatalf("direct %v: WritesVec %v", direct, d.WritesVec())
		}
		model := make([]byte, size)
		for round := 0; round < 60; round++ {
			var bufs [][]byte
			total := 0
			if round%2 == 0 { // an RLDev write: header, data, header, data...
				for n := 1 + rng.Intn(450); n > 0; n-- {
					h, b := make([]byte, 512), make([]byte, 4096)
					rng.Read(h)
					rng.Read(b)
					bufs = append(bufs, h, b)
					total += 4608
				}
			} else { // any sizes that add up to sectors, empty ones too
				for k := rng.Intn(40); k >= 0; k-- {
					b := make([]byte, rng.Intn(3)*rng.Intn(70000))
					rng.Read(b)
					bufs = append(bufs, b)
					total += len(b)
				}
				if r := total % SectorSize; r != 0 {
					b := make([]byte, SectorSize-r)
					rng.Read(b)
					bufs = append(bufs, b)
					total += len(b)
				}
			}
			off := int64(rng.Intn((size-total)/SectorSize+1)) * SectorSize
			n, err := d.WriteAtVec(bufs, off)
			if err != nil || n != total {
				t.Fatalf("direct %v round %d: wrote %d of %d at %d: %v", direct, round, n, total, off, err)
			}
			k := int(off)
			for _, b := range bufs {
				k += copy(model[k:], b)
			}
		}
		got := make([]byte, size)
		if _, err := d.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(got, model); i >= 0 {
			t.Fatalf("direct %v: byte %d reads %d, want %d", direct, i, got[i], model[i])
		}
		// Out of range and unaligned: refused, nothing written.
		if _, err := d.WriteAtVec([][]byte{make([]byte, 512), make([]byte, 100)}, 0); !errors.Is(err, ErrUnaligned) {
			t.Fatalf("an unaligned vector: %v", err)
		}
		if _, err := d.WriteAtVec([][]byte{make([]byte, 1024)}, size-512); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("a vector past the end: %v", err)
		}
		if _, err := d.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
			t.Fatalf("a refused vector changed the device: %v", err)
		}
		d.Close()
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
