package lock

// A randomized model check of the protocol cores alone (Clerk and Master
// wired by ordered per-session queues, no engine, no simulator): random
// acquires, releases, cancels (Withdraw), drops and closes, with session
// breaks that lose part of what is in flight and master failovers rebuilt
// from Hellos; checked after every step (cached leases compatible, every
// local holder covered, the master counting what clerks cache) and, once
// settled, for liveness (every waiter granted, no request left queued).
// Written by an outside review of the Withdraw message; with scripted tests
// of its crossings. GROVE_MODEL_SEEDS=N runs more seeds.

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"reflect"
	"sort"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
)

// ---------------------------------------------------------------- model

type rvClerk struct {
	id      ClerkID
	c       *Clerk
	sess    bool    // has a session (messages go out)
	sessID  int     // the clerk's current session
	mSess   int     // the session the master accepted last (its Hello handled)
	c2m     []rvMsg // clerk -> master, in order
	m2c     []rvMsg // master -> clerk, in order
	waiting []*Waiter
	holding []*Waiter
	closed  bool // Close ran and Goodbye was queued
	gone    bool // the master took the Goodbye and forgot it
}

type rvMsg struct {
	sess int
	msg  any
}

type rvWorld struct {
	t      *testing.T
	r      *rand.Rand
	m      *Master
	epoch  Epoch
	clerks []*rvClerk
	byID   map[ClerkID]*rvClerk
	trace  []string
	forget []ClerkID
}

func newRVWorld(t *testing.T, seed int64, n int) *rvWorld {
	w := &rvWorld{t: t, r: rand.New(rand.NewSource(seed)), epoch: 1, byID: map[ClerkID]*rvClerk{}}
	var infos []ClerkInfo
	for i := 0; i < n; i++ {
		id := ClerkID{Node: uint64(i + 1), Inc: 1, Seq: 1}
		infos = append(infos, ClerkInfo{ID: id, Kind: ""})
		rc := &rvClerk{id: id, c: NewClerk(id, "")}
		w.clerks = append(w.clerks, rc)
		w.byID[id] = rc
	}
	w.m = NewMaster(w.epoch, infos, nil)
	for _, rc := range w.clerks {
		w.connect(rc)
	}
	return w
}

func (w *rvWorld) logf(f string, a ...any) { w.trace = append(w.trace, fmt.Sprintf(f, a...)) }

func (w *rvWorld) connect(rc *rvClerk) {
	h := rc.c.Connect(w.epoch)
	rc.sess = true
	rc.sessID++
	rc.c2m = append(rc.c2m, rvMsg{rc.sessID, h})
}

func (w *rvWorld) clerkOut(rc *rvClerk, out []any) {
	for _, o := range out {
		switch x := o.(type) {
		case ToMaster:
			if rc.sess {
				rc.c2m = append(rc.c2m, rvMsg{rc.sessID, x.Msg})
				w.logf("  %v -> master: %#v", rc.id, x.Msg)
			}
		case Woken:
			for _, wt := range x.Waiters {
				for i, y := range rc.waiting {
					if y == wt {
						rc.waiting = append(rc.waiting[:i], rc.waiting[i+1:]...)
						break
					}
				}
				rc.holding = append(rc.holding, wt)
				w.logf("  %v woken %s %v", rc.id, wt.Name, wt.Mode)
			}
		}
	}
}

func (w *rvWorld) masterOut(out []any) {
	for _, o := range out {
		switch x := o.(type) {
		case Send:
			rc := w.byID[x.To]
			rc.m2c = append(rc.m2c, rvMsg{rc.mSess, x.Msg})
			w.logf("  master -> %v: %#v", x.To, x.Msg)
		case Drop:
			if rc := w.byID[x.Clerk]; !rc.closed {
				w.t.Fatalf("unexpected drop of %v\n%s", x.Clerk, w.dump())
			}
		case Forget:
			w.forget = append(w.forget, x.Clerk)
		}
	}
}

func (w *rvWorld) dump() string {
	s := ""
	for _, l := range w.trace {
		s += l + "\n"
	}
	return s
}

// check: leases cached at clerks are pairwise compatible, and the local
// holders are within the clerk's cached lease.
func (w *rvWorld) check() {
	names := map[string]bool{}
	for _, rc := range w.clerks {
		for _, h := range rc.holding {
			names[h.Name] = true
			if rc.c.Held(h.Name) < h.Mode {
				w.t.Fatalf("%v: local holder %s %v beyond cached lease %v\n%s", rc.id, h.Name, h.Mode, rc.c.Held(h.Name), w.dump())
			}
		}
		for n := range rc.c.leases {
			names[n] = true
		}
	}
	if w.m.Serving() {
		// What a clerk caches, the master counts as held by it.
		for _, rc := range w.clerks {
			for n, l := range rc.c.leases {
				var mm Mode
				if ml := w.m.locks[n]; ml != nil {
					mm = ml.holders[rc.id]
				}
				if l.granted > mm {
					w.t.Fatalf("%v caches %s %v, the master thinks it holds %v\n%s", rc.id, n, l.granted, mm, w.dump())
				}
			}
		}
	}
	for n := range names {
		for i, a := range w.clerks {
			for _, b := range w.clerks[i+1:] {
				if !Compatible(a.c.Held(n), b.c.Held(n)) {
					w.t.Fatalf("conflicting leases on %s: %v holds %v, %v holds %v\n%s", n, a.id, a.c.Held(n), b.id, b.c.Held(n), w.dump())
				}
			}
		}
	}
}

var rvStats struct{ withdraws, crossed, breaks, failovers, closes, forgotten int }

var rvNames = []string{"x", "y"}

// step does one random thing.
func (w *rvWorld) step(allowNew, faults bool) {
	rc := w.clerks[w.r.Intn(len(w.clerks))]
	switch k := w.r.Intn(20); {
	case k < 3 && allowNew && len(rc.waiting)+len(rc.holding) < 3:
		name := rvNames[w.r.Intn(len(rvNames))]
		mode := Shared
		if w.r.Intn(2) == 0 {
			mode = Exclusive
		}
		w.logf("%v acquire %s %v", rc.id, name, mode)
		wt, out := rc.c.Acquire(name, mode)
		if !wt.Granted && !wt.Failed {
			rc.waiting = append(rc.waiting, wt)
		} // else: the Woken in out makes it a holder
		w.clerkOut(rc, out)
	case k < 6 && len(rc.holding) > 0:
		i := w.r.Intn(len(rc.holding))
		h := rc.holding[i]
		rc.holding = append(rc.holding[:i], rc.holding[i+1:]...)
		w.logf("%v release %s %v", rc.id, h.Name, h.Mode)
		out, err := rc.c.Release(h)
		if err != nil {
			w.t.Fatalf("release: %v\n%s", err, w.dump())
		}
		w.clerkOut(rc, out)
	case k < 8 && allowNew && len(rc.waiting) > 0:
		i := w.r.Intn(len(rc.waiting))
		wt := rc.waiting[i]
		rc.waiting = append(rc.waiting[:i], rc.waiting[i+1:]...)
		w.logf("%v cancel %s %v", rc.id, wt.Name, wt.Mode)
		w.clerkOut(rc, rc.c.Cancel(wt))
	case k < 13 && len(rc.c2m) > 0:
		rm := rc.c2m[0]
		rc.c2m = rc.c2m[1:]
		msg := rm.msg
		if h, ok := msg.(Hello); ok {
			if rm.sess <= rc.mSess || h.Epoch != w.epoch {
				break
			}
			w.logf("master <- %v: %#v", rc.id, msg)
			rc.mSess = rm.sess // Accept: the older session is closed
			w.masterOut(w.m.Hello(h))
		} else {
			if rm.sess != rc.mSess {
				break // a straggler of a closed session
			}
			w.logf("master <- %v: %#v", rc.id, msg)
			if wd, ok := msg.(Withdraw); ok {
				rvStats.withdraws++
				queued := false
				if ml := w.m.locks[wd.Name]; ml != nil {
					for _, q := range ml.queue {
						queued = queued || q.clerk == rc.id
					}
				}
				if !queued {
					rvStats.crossed++
				}
			}
			w.masterOut(w.m.Handle(rc.id, msg))
		}
	case k < 18 && len(rc.m2c) > 0:
		rm := rc.m2c[0]
		rc.m2c = rc.m2c[1:]
		msg := rm.msg
		if rm.sess != rc.sessID || !rc.sess {
			break
		}
		w.logf("%v <- master: %#v", rc.id, msg)
		w.clerkOut(rc, rc.c.Handle(msg))
	case k == 19 && allowNew && w.r.Intn(40) == 0 && !rc.closed && len(rc.holding) == 0 && rc.sess:
		w.logf("%v closes", rc.id)
		failed, out, err := rc.c.Close()
		if err != nil {
			w.t.Fatalf("close: %v", err)
		}
		if len(failed) != len(rc.waiting) {
			w.t.Fatalf("close failed %d of %d waiters", len(failed), len(rc.waiting))
		}
		rc.waiting = nil
		w.clerkOut(rc, out)
		rc.c2m = append(rc.c2m, rvMsg{rc.sessID, Goodbye{}})
		rc.closed = true
		rvStats.closes++
	case k == 19 && len(w.forget) > 0 && w.r.Intn(3) == 0:
		id := w.forget[0]
		w.forget = w.forget[1:]
		w.logf("forgotten %v", id)
		w.masterOut(w.m.Forgotten(id))
		if rc := w.byID[id]; rc.closed {
			rvStats.forgotten++
			rc.gone = true
		}
	case k == 19 && w.r.Intn(4) == 0 && !rc.closed:
		name := rvNames[w.r.Intn(len(rvNames))]
		w.logf("%v drop %s", rc.id, name)
		w.clerkOut(rc, rc.c.Drop(name))
	case k == 18 && faults && w.r.Intn(10) == 0 && !rc.closed:
		// The session breaks: in-flight messages both ways are lost.
		// Messages in flight on it may still arrive (a prefix of the
		// clerk's) or be lost.
		w.logf("%v session breaks", rc.id)
		rvStats.breaks++
		rc.c2m = rc.c2m[:w.r.Intn(len(rc.c2m)+1)]
		rc.m2c = nil
		rc.c.Disconnected()
		rc.sess = false
		if w.r.Intn(2) == 0 {
			// The master notices now (otherwise only the next Hello tells it).
			for len(rc.c2m) > 0 && w.r.Intn(2) == 0 {
				rm := rc.c2m[0]
				rc.c2m = rc.c2m[1:]
				if rm.sess == rc.mSess {
					if _, ok := rm.msg.(Hello); !ok {
						w.logf("master <- %v (before the break is seen): %#v", rc.id, rm.msg)
						w.masterOut(w.m.Handle(rc.id, rm.msg))
					}
				}
			}
			rc.c2m = nil
			rc.mSess = rc.sessID // the master's side of it is closed too
			w.masterOut(w.m.Disconnected(rc.id))
		}
		if w.r.Intn(2) == 0 {
			w.logf("%v reconnects", rc.id)
			w.connect(rc)
		}
	case k == 18 && !rc.sess && !rc.closed:
		w.logf("%v reconnects", rc.id)
		w.connect(rc)
	case k == 19 && faults && w.r.Intn(60) == 0:
		// Master failover: a new master rebuilds from Hellos.
		w.epoch++
		rvStats.failovers++
		w.logf("failover to epoch %d", w.epoch)
		var infos []ClerkInfo
		w.forget = nil
		for _, c := range w.clerks {
			if !c.gone {
				infos = append(infos, ClerkInfo{ID: c.id, Kind: ""})
			}
			c.c2m, c.m2c = nil, nil
			c.mSess = c.sessID
			c.c.Disconnected()
			c.sess = false
		}
		w.m = NewMaster(w.epoch, infos, nil)
		for _, c := range w.clerks {
			if !c.gone {
				w.connect(c)
				if c.closed {
					c.c2m = append(c.c2m, rvMsg{c.sessID, Goodbye{}})
				}
			}
		}
	}
	w.check()
}

// settle: no new acquires or cancels; holders release, every session is
// up, messages flow; every waiter must be granted.
func (w *rvWorld) settle() {
	for _, rc := range w.clerks {
		if !rc.sess && !rc.closed {
			w.connect(rc)
		}
	}
	for i := 0; i < 20000; i++ {
		busy := false
		for _, rc := range w.clerks {
			if len(rc.waiting) > 0 || len(rc.holding) > 0 || len(rc.c2m) > 0 || len(rc.m2c) > 0 {
				busy = true
			}
		}
		if !busy {
			break
		}
		w.step(false, false)
	}
	for _, rc := range w.clerks {
		if len(rc.waiting) > 0 {
			var ws []string
			for _, x := range rc.waiting {
				ws = append(ws, x.Name+" "+x.Mode.String())
			}
			sort.Strings(ws)
			w.t.Fatalf("starved at %v: %v (master locks %+v)\n%s", rc.id, ws, w.m.Locks(), w.dump())
		}
	}
}

func runRV(t *testing.T, seeds int, faults bool) {
	if testing.Short() {
		// The race phase of scripts/test.sh: the model is single-threaded
		// (the cores, driven in one goroutine), so the race detector has
		// nothing to compare; the full count runs in the full suite.
		seeds = min(seeds, 100)
	}
	if n, err := strconv.Atoi(os.Getenv("GROVE_MODEL_SEEDS")); err == nil && n > 0 {
		seeds = n
	}
	rvStats = struct{ withdraws, crossed, breaks, failovers, closes, forgotten int }{}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		w := newRVWorld(t, seed, 3)
		for i := 0; i < 400; i++ {
			w.step(true, faults)
		}
		w.settle()
		for _, rc := range w.clerks {
			for n, l := range rc.c.leases {
				if l.want != None || l.revoking || len(l.waiters) > 0 {
					t.Fatalf("seed %d: %v left with state on %s: %+v", seed, rc.id, n, *l)
				}
			}
		}
		for _, l := range w.m.Locks() {
			if len(l.Waiters) > 0 {
				t.Fatalf("seed %d: master queue left: %+v", seed, l)
			}
		}
	}
	t.Logf("%+v", rvStats)
}

func TestProtocolModel(t *testing.T)       { runRV(t, 3000, false) }
func TestProtocolModelFaults(t *testing.T) { runRV(t, 3000, true) }

// ---------------------------------------------------------------- scripted

func rvMasterWith(ids ...ClerkID) *Master {
	var infos []ClerkInfo
	for _, id := range ids {
		infos = append(infos, ClerkInfo{ID: id, Kind: ""})
	}
	m := NewMaster(1, infos, nil)
	for _, id := range ids {
		hello(m, id, "", nil)
	}
	return m
}

func rvClerkUp(id ClerkID) *Clerk {
	c := NewClerk(id, "")
	c.Connect(1)
	c.Handle(Welcome{1})
	return c
}

// A Withdraw crossing a Grant: the master ignores it, the clerk caches the
// lease with the grant's token, answers a later revocation with that token,
// and the next waiter gets the lock. (Fine.)
func TestWithdrawCrossesGrant(t *testing.T) {
	m := rvMasterWith(cA, cB)
	b := rvClerkUp(cB)
	w, out := b.Acquire("x", Exclusive)
	out = m.Handle(cB, toMaster(out)[0])
	g, ok := find[Grant](sends(out, cB)) // in flight to B
	if !ok {
		t.Fatalf("no grant: %v", out)
	}
	out = b.Cancel(w)
	if msgs := toMaster(out); !reflect.DeepEqual(msgs, []any{Withdraw{"x"}}) {
		t.Fatalf("cancel: %v", msgs)
	}
	if out := m.Handle(cB, Withdraw{"x"}); len(out) != 0 {
		t.Fatalf("withdraw after the grant did something: %v", out)
	}
	b.Handle(g)
	if md, tok := b.Lease("x"); md != Exclusive || tok != g.Token || b.leases["x"].want != None {
		t.Fatalf("B after the crossing grant: %v %v %+v", md, tok, *b.leases["x"])
	}
	out = m.Handle(cA, Acquire{"x", Shared})
	r, ok := find[Revoke](sends(out, cB))
	if !ok {
		t.Fatalf("no revoke: %v", out)
	}
	rel := toMaster(b.Handle(r))
	if len(rel) != 1 || rel[0] != (Release{"x", Shared, g.Token}) {
		t.Fatalf("B's answer: %v", rel)
	}
	if _, ok := find[Grant](sends(m.Handle(cB, rel[0]), cA)); !ok {
		t.Fatal("A not granted")
	}
}

// An upgrade (shared held, exclusive wanted) withdrawn: the clerk keeps its
// shared lease, the master keeps it held and drops only the request; a
// shared waiter behind the withdrawn upgrade is granted at once. (Fine.)
func TestWithdrawUpgrade(t *testing.T) {
	m := rvMasterWith(cA, cB, cC)
	b := rvClerkUp(cB)
	w0, out := b.Acquire("x", Shared)
	gs, _ := find[Grant](sends(m.Handle(cB, toMaster(out)[0]), cB))
	b.Handle(gs)
	m.Handle(cA, Acquire{"x", Shared})
	b.Release(w0)
	w1, out := b.Acquire("x", Exclusive) // upgrade: A's shared stands in the way
	out = m.Handle(cB, toMaster(out)[0])
	if _, ok := find[Revoke](sends(out, cA)); !ok {
		t.Fatalf("A not revoked for B's upgrade: %v", out)
	}
	out = m.Handle(cC, Acquire{"x", Shared}) // queued behind the upgrade
	if _, ok := find[Grant](out); ok {
		t.Fatalf("C granted past the head of the queue: %v", out)
	}
	out = b.Cancel(w1)
	if msgs := toMaster(out); !reflect.DeepEqual(msgs, []any{Withdraw{"x"}}) {
		t.Fatalf("cancel: %v", msgs)
	}
	if b.Held("x") != Shared {
		t.Fatalf("B lost its shared lease: %v", b.Held("x"))
	}
	out = m.Handle(cB, Withdraw{"x"})
	if g, ok := find[Grant](sends(out, cC)); !ok || g.Mode != Shared {
		t.Fatalf("C not granted after the upgrade was withdrawn: %v", out)
	}
	if h := m.Locks()[0].Holders; !reflect.DeepEqual(h, map[ClerkID]Mode{cA: Shared, cB: Shared, cC: Shared}) {
		t.Fatalf("holders: %v", h)
	}
}

// Cancel while disconnected: nothing is sent, and the Hello no longer
// reports the want, to the same master or to a new one. (Fine.)
func TestWithdrawWhileDisconnected(t *testing.T) {
	b := rvClerkUp(cB)
	w, _ := b.Acquire("x", Exclusive)
	b.Disconnected()
	b.Cancel(w) // the runtime drops ToMaster without a session
	if h := b.Connect(2); len(h.Want) != 0 || len(h.Held) != 0 {
		t.Fatalf("Hello after the cancel: %+v", h)
	}
}

// Wire: Withdraw round-trips and an empty or oversized name is refused.
func TestWireWithdraw(t *testing.T) {
	b, _ := proto.Marshal(EncodeClerkMessage(Withdraw{"a\x00b"}))
	if got, err := DecodeSessionRequest(b); err != nil || got != (Withdraw{"a\x00b"}) {
		t.Fatalf("round trip: %#v %v", got, err)
	}
	for _, n := range [][]byte{nil, make([]byte, MaxNameLen+1)} {
		m := &pb.SessionRequest{Msg: &pb.SessionRequest_Withdraw{Withdraw: &pb.LockWithdraw{Name: n}}}
		if _, err := DecodeClerkMessage(m); !errors.Is(err, ErrBadMessage) {
			t.Fatalf("withdraw of a %d-byte name: %v", len(n), err)
		}
	}
}

// A waiter that leaves the queue because its session broke
// (Master.Disconnected) must not hold back a compatible waiter behind it:
// the lock is retried at once (found by the review of Withdraw, which
// retries; Disconnected did not).
func TestDisconnectedHeadRetried(t *testing.T) {
	m := rvMasterWith(cA, cB, cC)
	m.Handle(cA, Acquire{"x", Shared})
	m.Handle(cB, Acquire{"x", Exclusive}) // head: A revoked
	m.Handle(cC, Acquire{"x", Shared})    // compatible with A, behind B
	out := m.Disconnected(cB)
	if g, ok := find[Grant](sends(out, cC)); !ok || g.Mode != Shared {
		t.Fatalf("C, compatible with every holder, not granted when the head's session broke: %v", out)
	}
}
