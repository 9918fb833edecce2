package rldev

import (
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/disk"
)

// TestGenerationOpsCountQueueFullJobs: every disk job of a generation, including
// those that find the disk's queue full (diskJob's goroutine path), is
// counted in generation.ops, so that Start's old.ops.Wait() returns only
// once all of them have landed (the safety premise of the clerk's
// per-incarnation "maybe written" rule, commit b4d17a1).
type gateDev struct {
	*disk.MemDevice
	gate    chan struct{}
	started atomic.Int64
	landed  atomic.Int64
}

func (d *gateDev) WriteAt(p []byte, off int64) (int, error) {
	d.started.Add(1)
	<-d.gate
	n, err := d.MemDevice.WriteAt(p, off)
	d.landed.Add(1)
	return n, err
}

func TestGenerationOpsCountQueueFullJobs(t *testing.T) {
	dev := &gateDev{MemDevice: disk.NewMemDevice(1<<20, rand.New(rand.NewSource(1))), gate: make(chan struct{})}
	s := NewService(ServiceConfig{Node: 1, Disks: []ServiceDisk{{Index: 0, Dev: dev}}, DiskWorkers: 1})
	g := &generation{}         // no engine: continuations are dropped (s.do)
	const jobs = 1024 + 1 + 20 // the queue's room, one running, 20 that find it full
	s.mu.Lock()
	for i := 0; i < jobs; i++ {
		s.diskJob(g, 0, func(d disk.Device) func(Env) []any {
			_, _ = d.WriteAt(make([]byte, 4096), 0)
			return func(Env) []any { return nil }
		})
	}
	s.mu.Unlock()
	waited := make(chan struct{})
	go func() { g.ops.Wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("ops.Wait returned with every write still pending")
	case <-time.After(300 * time.Millisecond):
	}
	// Release all but the last write: Wait must still block.
	for i := 0; i < jobs-1; i++ {
		dev.gate <- struct{}{}
	}
	select {
	case <-waited:
		t.Fatalf("ops.Wait returned with a write pending (%d of %d landed)", dev.landed.Load(), jobs)
	case <-time.After(300 * time.Millisecond):
	}
	dev.gate <- struct{}{}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("ops.Wait did not return once every write landed")
	}
	if got := dev.landed.Load(); got != jobs {
		t.Fatalf("ops.Wait returned with %d of %d writes landed", got, jobs)
	}
	s.stop()
	s.wg.Wait()
}
