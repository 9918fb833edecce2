package sim

import (
	"testing"
	"time"
)

// Sessions deliver in order despite random delays; a block breaks them and
// both ends hear of it once; nothing arrives after the break.
func TestSessionOrderAndBreak(t *testing.T) {
	w := NewWorld(7)
	n := w.NewNetwork()
	n.MaxDelay = 20 * time.Millisecond
	a, b := w.NewProcess(1), w.NewProcess(2)
	n.Attach(a)
	n.Attach(b)
	ea, eb := n.OpenSession(1, 2)
	var got []int
	closed := 0
	eb.Handle(func(m any) { got = append(got, m.(int)) }, func() { closed++ })
	ea.Handle(nil, func() { closed++ })
	for i := 0; i < 100; i++ {
		ea.Send(i)
	}
	w.RunUntil(time.Second)
	for i, v := range got {
		if v != i {
			t.Fatalf("out of order at %d: %v", i, got[:i+1])
		}
	}
	if len(got) != 100 {
		t.Fatalf("got %d of 100", len(got))
	}
	n.Partition([]uint64{1}, []uint64{2})
	ea.Send(100)
	w.RunUntil(2 * time.Second)
	if !ea.Closed() || closed != 2 || len(got) != 100 {
		t.Fatalf("after partition: closed=%v notices=%d got=%d", ea.Closed(), closed, len(got))
	}
}

// A paused process runs its due events when it resumes; a crashed one never.
func TestPauseAndCrash(t *testing.T) {
	w := NewWorld(1)
	p := w.NewProcess(1)
	var ran []time.Duration
	p.Pause(500 * time.Millisecond)
	p.Go(100*time.Millisecond, func() { ran = append(ran, w.Now()) })
	w.RunUntil(time.Second)
	if len(ran) != 1 || ran[0] != 500*time.Millisecond {
		t.Fatalf("paused event ran at %v, want once at 500ms", ran)
	}
	p.Go(100*time.Millisecond, func() { ran = append(ran, w.Now()) })
	p.Crash()
	p.Restart()
	w.RunUntil(2 * time.Second)
	if len(ran) != 1 {
		t.Fatal("an event of a crashed life ran after restart")
	}
}

// Same seed, same run: the simulator is deterministic.
func TestDeterministic(t *testing.T) {
	trace := func() []time.Duration {
		w := NewWorld(42)
		n := w.NewNetwork()
		n.DropRate, n.DupRate, n.MaxDelay = 0.3, 0.1, 10*time.Millisecond
		var out []time.Duration
		p := w.NewProcess(2)
		p.Deliver = func(uint64, any) { out = append(out, w.Now()) }
		n.Attach(p)
		for i := 0; i < 200; i++ {
			n.Send(1, 2, []byte{byte(i)})
		}
		w.RunUntil(time.Second)
		return out
	}
	a, b := trace(), trace()
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("runs differ: %d vs %d deliveries", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("runs differ at %d", i)
		}
	}
}

// Clocks drift within the bound and convert back to true time without
// firing early.
func TestClockDrift(t *testing.T) {
	w := NewWorld(3)
	for i := 0; i < 100; i++ {
		c := w.NewClock(0.01)
		if c.Rate() < 0.99 || c.Rate() > 1.01 {
			t.Fatalf("rate %v outside the bound", c.Rate())
		}
		local := c.Now().Add(time.Second)
		if tt := c.TrueAt(local); Epoch.Add(c.Local(tt)).Before(local) {
			t.Fatal("TrueAt fires before the local deadline")
		}
	}
}
