package rldev

import (
	"bytes"
	"math/rand"
	"path/filepath"
	"sync"
	"testing"

	"github.com/grovestore/grove/internal/disk"
)

// A write of more blocks than the pools' classes hold (2^(physClasses-1)
// = 2048: 3000 blocks, 6000 iovecs, more than one pwritev's 1024), on the
// vectored and the gathered path: the bytes of encodeBlocks, each block
// decodes; the headers of the big write are not pooled.
func TestReview95HugeWrite(t *testing.T) {
	const n = 3000
	size := int64(n*PhysBlockSize + 1<<20)
	file, err := disk.OpenFile(filepath.Join(t.TempDir(), "d"), size)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	mem := disk.NewMemDevice(size, rand.New(rand.NewSource(1)))
	data := make([]byte, n*BlockSize)
	rand.New(rand.NewSource(2)).Read(data)
	gens := make([]uint64, n)
	for i := range gens {
		gens[i] = uint64(i) + 1
		if i%97 == 0 {
			gens[i] = badGen
		}
	}
	want := encodeBlocks(7, 11, data, gens, 0)
	for _, dev := range []disk.Device{file, mem} {
		off := int64(4096 + 512)
		if err := DoWrite(dev, DiskWrite{Off: off, Encode: func() Encoded { return encodeBlocksVec(7, 11, data, gens, 0) }}); err != nil {
			t.Fatal(err)
		}
		back := make([]byte, len(want))
		if _, err := dev.ReadAt(back, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, want) {
			t.Fatalf("%T: other bytes", dev)
		}
		for i := 0; i < n; i++ {
			_, g, st := DecodeBlock(back[i*PhysBlockSize:(i+1)*PhysBlockSize], 7, 11+uint64(i))
			if gens[i] == badGen {
				if st != BlockCorrupt {
					t.Fatalf("block %d: %v", i, st)
				}
			} else if st != BlockOK || g != gens[i] {
				t.Fatalf("block %d: %v gen %d", i, st, g)
			}
		}
	}
}

// Concurrent DoWrites of disjoint runs (the disk workers): the header
// pool hands no buffer to two writes at once and takes none back early
// (each block's bytes checked), the caller's data is untouched.
func TestReview95ConcurrentDoWrite(t *testing.T) {
	const runs, per = 64, 37
	size := int64(runs*per*PhysBlockSize + 4096)
	file, err := disk.OpenFile(filepath.Join(t.TempDir(), "d"), size)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	datas := make([][]byte, runs)
	sums := make([][]byte, runs)
	for r := range datas {
		datas[r] = make([]byte, per*BlockSize)
		rand.New(rand.NewSource(int64(r))).Read(datas[r])
		sums[r] = bytes.Clone(datas[r])
	}
	for round := 0; round < 5; round++ {
		var wg sync.WaitGroup
		errs := make(chan error, runs)
		for r := 0; r < runs; r++ {
			wg.Add(1)
			go func(r int) {
				defer wg.Done()
				n := 1 + (r+round)%per
				gen := uint64(round*1000 + r + 1)
				blk := uint64(r * per)
				off := int64(r) * per * PhysBlockSize
				errs <- DoWrite(file, DiskWrite{Off: off, Encode: func() Encoded { return encodeBlocksVec(3, blk, datas[r][:n*BlockSize], nil, gen) }})
			}(r)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		for r := 0; r < runs; r++ {
			n := 1 + (r+round)%per
			back := make([]byte, n*PhysBlockSize)
			if _, err := file.ReadAt(back, int64(r)*per*PhysBlockSize); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				d, g, st := DecodeBlock(back[i*PhysBlockSize:(i+1)*PhysBlockSize], 3, uint64(r*per+i))
				if st != BlockOK || g != uint64(round*1000+r+1) || !bytes.Equal(d, datas[r][i*BlockSize:(i+1)*BlockSize]) {
					t.Fatalf("round %d run %d block %d: %v gen %d", round, r, i, st, g)
				}
			}
			if !bytes.Equal(datas[r], sums[r]) {
				t.Fatalf("run %d: the caller's data changed", r)
			}
		}
	}
}
