package bench

import (
	"context"
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// RunBarePair runs a write cell as a replicated write with nothing else:
// each of l.QD writers writes its block to both files (l.File and
// second) and waits until both are durable, each file's syncs group-
// committed with one in flight, as an RLDev's replicas do (engine.go's
// writeDurable). No network, no checksums or block headers, no logs, one
// process: the ceiling of that design on this machine, against which
// Grove's own overhead is measured (two independent fio processes,
// RunFioPair, wait for no one: each write there is done when its own copy
// is). The files' pages are dropped first, as fio drops its file's.
func RunBarePair(ctx context.Context, l FioLoad, second string) (IOResult, error) {
	if !l.Write {
		return IOResult{}, errors.New("bench: the bare pair runs writes only")
	}
	var files [2]*groupSync
	for i, name := range []string{l.File, second} {
		f, err := os.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			return IOResult{}, err
		}
		defer f.Close()
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return IOResult{}, err
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			return IOResult{}, err
		}
		files[i] = newGroupSync(f)
	}
	lat, elapsed, err := runWorkers(ctx, l.QD, l.Size, l.Span, l.QD, l.Seq, l.For, func(w int) int64 { return int64(w) * 7919 },
		func(_ context.Context, _ int, b uint64, buf []byte) error {
			var errs [2]error
			var both sync.WaitGroup
			for i, g := range files {
				both.Add(1)
				go func() {
					defer both.Done()
					if _, err := g.f.WriteAt(buf, int64(b*l.Size)); err != nil {
						errs[i] = err
						return
					}
					errs[i] = g.durable()
				}()
			}
			both.Wait()
			return errors.Join(errs[:]...)
		})
	if err != nil {
		return IOResult{}, err
	}
	return IOResult{Result: Result{System: "bare-pair", Concurrency: l.QD, Ops: len(lat), Elapsed: elapsed,
		P50: Percentile(lat, 50), P99: Percentile(lat, 99)}, Bytes: uint64(len(lat)) * l.Size}, nil
}

// groupSync is one file's group commit: a writer waits for a sync that
// started after its write returned; one sync runs at a time, covering
// every write that returned before it started.
type groupSync struct {
	f        *os.File
	mu       sync.Mutex
	cond     *sync.Cond
	started  uint64 // syncs started
	done     uint64 // the newest sync ended
	err      error  // the first sync that failed
	inflight bool
}

func newGroupSync(f *os.File) *groupSync {
	g := &groupSync{f: f}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// durable returns once a sync that started after the call ended.
func (g *groupSync) durable() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	need := g.started + 1
	for g.done < need && g.err == nil {
		if g.inflight {
			g.cond.Wait()
			continue
		}
		g.started++
		my := g.started
		g.inflight = true
		g.mu.Unlock()
		err := unix.Fdatasync(int(g.f.Fd()))
		g.mu.Lock()
		g.inflight = false
		g.done = my
		if err != nil && g.err == nil {
			g.err = err
		}
		g.cond.Broadcast()
	}
	return g.err
}
