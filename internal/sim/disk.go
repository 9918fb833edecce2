package sim

import (
	"errors"
	"time"
)

// Disk is a node's simulated local disk of small files, written whole and
// atomically (as disk.FS.WriteFileSync does: temp file, fsync, rename).
// Writes take a random time and can fail; a write reaches the platter at a
// random moment before it is acknowledged, whether or not the process is
// still running then (a crash between the two keeps the new contents).
//
// Lies makes the disk acknowledge writes it never makes durable (a broken
// write cache): the process reads its own writes back while it runs, and a
// crash loses them. Checkers read Durable, the platter, to judge.
type Disk struct {
	w        *World
	durable  map[string][]byte // on the platter: survives crashes
	cache    map[string][]byte // what the running process reads back
	FailRate float64           // probability a write fails (EIO, ENOSPC)
	// Writes take [MinLatency, MaxLatency]; with probability StallRate a
	// write takes Stall longer (a slow disk).
	MinLatency, MaxLatency time.Duration
	StallRate              float64
	Stall                  time.Duration
	Lies                   bool
	Writes, Failures       int
}

// ErrDiskFailed is what a failed simulated write returns.
var ErrDiskFailed = errors.New("sim: disk write failed (EIO)")

// NewDisk returns an empty, fault-free disk with sub-millisecond writes.
func (w *World) NewDisk() *Disk {
	return &Disk{w: w, durable: map[string][]byte{}, cache: map[string][]byte{},
		MinLatency: 100 * time.Microsecond, MaxLatency: 2 * time.Millisecond, Stall: time.Second}
}

// Read returns a file's contents as the running process sees them.
func (d *Disk) Read(path string) ([]byte, bool) {
	b, ok := d.cache[path]
	return append([]byte(nil), b...), ok
}

// Durable returns a file's contents on the platter (what survives a crash).
func (d *Disk) Durable(path string) ([]byte, bool) {
	b, ok := d.durable[path]
	return append([]byte(nil), b...), ok
}

// Crash drops everything that is not durable: the process restarts from
// the platter.
func (d *Disk) Crash() {
	d.cache = map[string][]byte{}
	for p, b := range d.durable {
		d.cache[p] = b
	}
}

// Write replaces path with data and calls done, in p's current life, when
// the write is acknowledged (nil) or failed. A failed write changes nothing.
func (d *Disk) Write(p *Process, path string, data []byte, done func(error)) {
	data = append([]byte(nil), data...)
	d.Writes++
	lat := d.w.Between(d.MinLatency, d.MaxLatency)
	if d.w.Rand.Float64() < d.StallRate {
		lat += d.Stall
	}
	if d.w.Rand.Float64() < d.FailRate {
		d.Failures++
		p.Go(lat, func() { done(ErrDiskFailed) })
		return
	}
	land := d.w.Between(0, lat)
	life := p.life
	d.w.After(land, func() {
		if !d.Lies {
			d.durable[path] = data
		}
		if p.life == life { // a crash already reset what the process sees
			d.cache[path] = data
		}
	})
	p.Go(lat, func() { done(nil) })
}
