// Package sim is Grove's deterministic whole-cluster simulator: virtual time,
// a seeded event loop, a datagram network that drops, delays, duplicates,
// reorders and partitions, per-node clocks with bounded drift, and process
// crash, restart and pause. One seed drives every random choice, so a failing
// run replays exactly from its seed.
//
// Protocol cores (fd, and later the lock service, RLDev, 2PC) are plain
// structs; a test wires them to a World with small adapters. Everything runs
// on the test's goroutine: no goroutines, no wall clock.
package sim

import (
	"container/heap"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"testing"
	"time"
)

// Epoch is virtual time zero. Local clocks are offsets from it.
var Epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// World is one simulation run.
type World struct {
	Seed int64
	Rand *rand.Rand
	now  time.Duration
	q    eventQueue
	seq  uint64
}

// NewWorld starts a world at virtual time 0.
func NewWorld(seed int64) *World {
	return &World{Seed: seed, Rand: rand.New(rand.NewSource(seed))}
}

// Now is the true (global) virtual time since Epoch.
func (w *World) Now() time.Duration { return w.now }

// At schedules fn at true virtual time t (not before now).
func (w *World) At(t time.Duration, fn func()) {
	if t < w.now {
		t = w.now
	}
	w.seq++
	heap.Push(&w.q, &event{at: t, seq: w.seq, fn: fn})
}

// After schedules fn d after now.
func (w *World) After(d time.Duration, fn func()) { w.At(w.now+d, fn) }

// RunUntil runs events in time order until virtual time t.
func (w *World) RunUntil(t time.Duration) {
	for w.q.Len() > 0 && w.q[0].at <= t {
		e := heap.Pop(&w.q).(*event)
		w.now = e.at
		e.fn()
	}
	if w.now < t {
		w.now = t
	}
}

// Between returns a uniformly random duration in [lo, hi].
func (w *World) Between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.Rand.Int63n(int64(hi-lo)+1))
}

type event struct {
	at  time.Duration
	seq uint64 // FIFO among equal times, for determinism
	fn  func()
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// Clock is a node's local clock: it moves forward at a constant rate within
// the drift bound and has an arbitrary offset. Local time is what the node's
// protocol code sees; it never sees true time.
type Clock struct {
	w      *World
	rate   float64       // local seconds per true second
	offset time.Duration // local time at true time 0
}

// NewClock returns a clock whose rate is drawn from [1-maxDrift, 1+maxDrift].
func (w *World) NewClock(maxDrift float64) *Clock {
	rate := 1 + maxDrift*(2*w.Rand.Float64()-1)
	return &Clock{w: w, rate: rate, offset: time.Duration(w.Rand.Int63n(int64(time.Hour)))}
}

// Now is the node's local time.
func (c *Clock) Now() time.Time { return Epoch.Add(c.Local(c.w.now)) }

// Local converts a true time to this clock's local reading.
func (c *Clock) Local(t time.Duration) time.Duration {
	return c.offset + time.Duration(float64(t)*c.rate)
}

// TrueAt converts a local reading back to true time (rounded up, so that a
// timer never fires before its local deadline).
func (c *Clock) TrueAt(local time.Time) time.Duration {
	l := local.Sub(Epoch) - c.offset
	t := time.Duration(float64(l)/c.rate) + 1
	return t
}

// Rate is the clock's rate, for logs.
func (c *Clock) Rate() float64 { return c.rate }

// Seeds returns the seeds a randomized test should run: n seeds starting at a
// base taken from GROVE_SEED (replay one seed) or GROVE_SEEDS (run that many),
// else from the defaults. Each seed is printed by the caller on failure.
func Seeds(t testing.TB, n int) []int64 {
	if s := os.Getenv("GROVE_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("GROVE_SEED=%q: %v", s, err)
		}
		return []int64{v}
	}
	if s := os.Getenv("GROVE_SEEDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			t.Fatalf("GROVE_SEEDS=%q: want a positive count", s)
		}
		n = v
	}
	base := int64(1)
	if s := os.Getenv("GROVE_SEED_BASE"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("GROVE_SEED_BASE=%q: %v", s, err)
		}
		base = v
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = base + int64(i)
	}
	return out
}

// RandomSeed returns the seed of a randomized test that runs one seed of
// real goroutines (its faults and choices replay from the seed, its
// interleavings are the scheduler's): GROVE_SEED if set (a bad value fails
// the test), else one from the clock. It logs the seed with what it
// replays.
func RandomSeed(t testing.TB, replays string) int64 {
	seed := time.Now().UnixNano() % 1_000_000
	if s := os.Getenv("GROVE_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("GROVE_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (GROVE_SEED=%d replays %s; the interleavings are the scheduler's)", seed, seed, replays)
	return seed
}

// ReplayHint is the line a failing randomized test prints.
func ReplayHint(test string, seed int64) string {
	return fmt.Sprintf("replay with: GROVE_SEED=%d go test -run '%s' ./...", seed, test)
}
