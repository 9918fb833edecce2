package btree

// Review 4: the simulator's lock stand-in against the real lock service's
// contract (internal/lock, internal/fd). Each test fails on the stand-in
// where it is more lenient than the real system.

import (
	"context"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/lock"
)

func review4Nop(context.Context, lock.Recovery) error { return nil }

// A clerk cut off the lock service cannot tell the master anything: a
// lease it was asked to give back (the revocation came before the cut)
// stays its own at the master until it is declared dead and recovered,
// even once its local holder releases. In the stand-in, simHold.Release
// (and drop) settle the revocation at the master at once, through the
// partition, and another clerk is granted the lock while the cut-off
// clerk is alive and not yet declared dead.
func TestReview4CutClerkReleaseCrossesPartition(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	locks := newSimLocks(ctx, rand.New(rand.NewSource(1)))
	a := locks.newClerk(1, review4Nop)
	b := locks.newClerk(2, review4Nop)
	ha, err := a.Acquire(ctx, "x", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "x", lock.Exclusive)
		got <- err
	}()
	for !a.Revoking("x") {
		time.Sleep(time.Millisecond)
	}
	locks.setCut(a, true, false) // the partition begins
	cutAt := time.Now()
	ha.Release() // the cache wrote the node back and gives its pin up, locally
	select {
	case err := <-got:
		locks.mu.Lock()
		dead := a.dead
		locks.mu.Unlock()
		if err == nil && !dead {
			t.Fatalf("clerk 2 was granted x %v after clerk 1 was cut off, while clerk 1 is alive and not declared dead: its release crossed the partition (the real master waits for the dead verdict and a recovery)", time.Since(cutAt))
		}
	case <-time.After(locks.lease + locks.grace + 20*time.Millisecond):
	}
}

// The real engine ignores the end of a recovery run on a clerk that is
// dead (engine.go RecoveryFinished: "the master decides again"), so the
// dead clerk's leases are recovered again by a live clerk. The stand-in
// frees them on the word of a runner that was cut off and declared dead
// meanwhile: another clerk gets the lock with no run of its own.
func TestReview4RecoveryByDeadRunnerAccepted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	locks := newSimLocks(ctx, rand.New(rand.NewSource(1)))
	d := locks.newClerk(1, review4Nop)
	if _, err := d.Acquire(ctx, "x", lock.Exclusive); err != nil {
		t.Fatal(err)
	}
	started, finish := make(chan struct{}), make(chan struct{})
	r := locks.newClerk(2, func(ctx context.Context, _ lock.Recovery) error {
		close(started)
		<-finish
		return nil
	})
	locks.kill(d)
	<-started
	locks.setCut(r, true, false) // the runner is cut off the lock service...
	for {                        // ...and declared dead
		locks.mu.Lock()
		dead := r.dead
		locks.mu.Unlock()
		if dead {
			break
		}
		time.Sleep(time.Millisecond)
	}
	var runs atomic.Int32
	c := locks.newClerk(3, func(context.Context, lock.Recovery) error { runs.Add(1); return nil })
	close(finish) // the dead runner's run ends "successfully"
	if _, err := c.Acquire(ctx, "x", lock.Exclusive); err != nil {
		t.Fatal(err)
	}
	if runs.Load() == 0 {
		t.Fatal("clerk 3 was granted x with clerk 1's leases recovered only by a run on clerk 2, which was declared dead before its run ended (the real master discards that run and recovers again)")
	}
}

// fd.Subject: "Past its deadline an incarnation is fenced for good (Subject
// never revives)": the clerk's ValidUntil stays zero and it grants nothing
// more. The stand-in revives a clerk whose ValidUntil passed if the cut
// heals before the dead verdict (setCut resets renewed): its cache and
// cached leases are good again.
func TestReview4ClerkRevivesPastDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	locks := newSimLocks(ctx, rand.New(rand.NewSource(1)))
	a := locks.newClerk(1, review4Nop)
	h, err := a.Acquire(ctx, "x", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	locks.setCut(a, true, false)
	until := a.ValidUntil()
	time.Sleep(time.Until(until) + locks.grace/3) // past the deadline, before the verdict
	locks.mu.Lock()
	dead := a.dead
	locks.mu.Unlock()
	if dead {
		t.Skip("declared dead already (slow scheduling)")
	}
	locks.setCut(a, false, false)
	if u := a.ValidUntil(); u.After(time.Now()) {
		actx, acancel := context.WithTimeout(ctx, 5*time.Millisecond)
		defer acancel()
		_, err := a.Acquire(actx, "x", lock.Exclusive)
		t.Fatalf("a clerk past its deadline (%v ago) revived: ValidUntil %v from now, cached lease granted again (err %v)", time.Since(until), time.Until(u), err)
	}
}
