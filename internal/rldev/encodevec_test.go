package rldev

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/disk"
)

// encodeBlocksVec writes the bytes encodeBlocks does (runs of 1 to 600
// blocks, one generation for all or one per block, blocks a copy marks
// corrupt among them), and each decodes as written: the vectored write
// and the gathered one are the same on disk, and DoWrite puts them there
// on a buffered file (vectored), on a direct one and on the simulator's
// device (gathered). GROVE_SEED replays.
func TestEncodeBlocksVecMatches(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("GROVE_SEED"); s != "" {
		fmt.Sscan(s, &seed)
	}
	t.Logf("seed %d (GROVE_SEED replays)", seed)
	rng := rand.New(rand.NewSource(seed))
	const size = 8 << 20
	file, err := disk.OpenFile(filepath.Join(t.TempDir(), "d"), size)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	direct, err := disk.OpenFileWith(filepath.Join(t.TempDir(), "d"), size, disk.FileOptions{DirectWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	mem := disk.NewMemDevice(size, rand.New(rand.NewSource(seed)))
	if !file.WritesVec() {
		t.Fatal("a buffered file device writes no vectors")
	}
	rounds := 80
	if testing.Short() {
		rounds = 20 // the race phase: the bytes compared are what it slows
	}
	for round := 0; round < rounds; round++ {
		n := 1 + rng.Intn(600)
		if round%4 == 0 {
			n = 1 + rng.Intn(3)
		}
		data := make([]byte, n*BlockSize)
		rng.Read(data)
		id, block, gen := rng.Uint64()%100, uint64(rng.Intn(1000)), rng.Uint64()>>1
		var gens []uint64
		if round%2 == 1 {
			gens = make([]uint64, n)
			for i := range gens {
				gens[i] = uint64(rng.Intn(1000)) + 1
				if rng.Intn(10) == 0 {
					gens[i] = badGen
				}
			}
		}
		want := encodeBlocks(id, block, data, gens, gen)
		enc := encodeBlocksVec(id, block, data, gens, gen)
		if enc.Len() != len(want) {
			t.Fatalf("round %d: %d bytes, want %d", round, enc.Len(), len(want))
		}
		got := enc.gather()
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d (%d blocks): the vectored encoding differs from encodeBlocks", round, n)
		}
		for i := 0; i < n; i++ {
			d, g, st := DecodeBlock(got[i*PhysBlockSize:(i+1)*PhysBlockSize], id, block+uint64(i))
			wantGen := gen
			if gens != nil {
				wantGen = gens[i]
			}
			if wantGen == badGen {
				if st != BlockCorrupt {
					t.Fatalf("round %d block %d: a block marked corrupt decodes %v", round, i, st)
				}
				continue
			}
			if st != BlockOK || g != wantGen || !bytes.Equal(d, data[i*BlockSize:(i+1)*BlockSize]) {
				t.Fatalf("round %d block %d: %v gen %d, want ok gen %d", round, i, st, g, wantGen)
			}
		}
		putPhys(got)
		enc.release()
		off := int64(rng.Intn((size-len(want))/disk.SectorSize+1)) * disk.SectorSize
		for _, dev := range []disk.Device{file, direct, mem} {
			if err := DoWrite(dev, DiskWrite{Off: off, Encode: func() Encoded { return encodeBlocksVec(id, block, data, gens, gen) }}); err != nil {
				t.Fatal(err)
			}
			back := make([]byte, len(want))
			if _, err := dev.ReadAt(back, off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, want) {
				t.Fatalf("round %d: DoWrite on %T put other bytes on the device", round, dev)
			}
		}
		putPhys(want)
	}
}
