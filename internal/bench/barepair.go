package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"sync"
	"time"

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
	blocks := l.Span / l.Size
	if blocks == 0 {
		return IOResult{}, fmt.Errorf("span %d smaller than the request size %d", l.Span, l.Size)
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
	var (
		mu       sync.Mutex
		lat      []time.Duration
		firstErr error
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(l.For)
	start := time.Now()
	for q := 0; q < l.QD; q++ {
		wg.Add(1)
		go func(worker int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(worker) * 7919))
			buf := make([]byte, l.Size)
			r.Read(buf)
			var mine []time.Duration
			next := uint64(worker) * (blocks / uint64(max(l.QD, 1)))
			for time.Now().Before(deadline) && ctx.Err() == nil {
				var b uint64
				if l.Seq {
					b = next % blocks
					next++
				} else {
					b = uint64(r.Int63n(int64(blocks)))
				}
				t := time.Now()
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
				if err := errors.Join(errs[:]...); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}(q)
	}
	wg.Wait()
	if firstErr != nil {
		return IOResult{}, firstErr
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return IOResult{Result: Result{System: "bare-pair", Concurrency: l.QD, Ops: len(lat), Elapsed: time.Since(start),
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
