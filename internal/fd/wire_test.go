package fd

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/sim"
)

func simNow() time.Time { return sim.Epoch }

var testKey = Key("0123456789abcdef0123456789abcdef")

func TestPacketRoundTrip(t *testing.T) {
	for _, p := range []Packet{
		{Kind: KindBeacon, Subject: 3, Incarnation: 7, Seq: 99},
		{Kind: KindEcho, Subject: 1, Incarnation: 1, Seq: 1 << 60, Observer: 2},
	} {
		got, err := Open(p.Seal(nil, testKey), Keyring{Sign: testKey})
		if err != nil || got != p {
			t.Fatalf("round trip of %+v: got %+v, %v", p, got, err)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good := Packet{Kind: KindBeacon, Subject: 3, Incarnation: 7, Seq: 99}.Seal(nil, testKey)
	flip := func(i int) []byte { b := append([]byte(nil), good...); b[i] ^= 0x40; return b }
	seal := func(p Packet) []byte { return p.Seal(nil, testKey) }
	keys := Keyring{Sign: testKey}
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrShortPacket},
		{"truncated", good[:PacketSize-1], ErrShortPacket},
		{"long", append(append([]byte(nil), good...), 0), ErrShortPacket},
		{"magic", flip(0), ErrBadMagic},
		{"payload bit flip", flip(20), ErrBadMAC},
		{"mac bit flip", flip(PacketSize - 1), ErrBadMAC},
		{"other key", Packet{Kind: KindBeacon, Subject: 3, Incarnation: 7, Seq: 99}.Seal(nil, Key("another-key-of-sixteen-bytes-or-more")), ErrBadMAC},
		{"kind", seal(Packet{Kind: 9, Subject: 1, Incarnation: 1, Seq: 1}), ErrBadKind},
		{"zero subject", seal(Packet{Kind: KindBeacon, Incarnation: 1, Seq: 1}), ErrBadField},
		{"zero incarnation", seal(Packet{Kind: KindBeacon, Subject: 1, Seq: 1}), ErrBadField},
		{"zero seq", seal(Packet{Kind: KindBeacon, Subject: 1, Incarnation: 1}), ErrBadField},
		{"echo without observer", seal(Packet{Kind: KindEcho, Subject: 1, Incarnation: 1, Seq: 1}), ErrBadField},
		{"beacon with observer", seal(Packet{Kind: KindBeacon, Subject: 1, Incarnation: 1, Seq: 1, Observer: 2}), ErrBadField},
	}
	for _, c := range cases {
		if _, err := Open(c.b, keys); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// A rotation: a node signing with the new key is accepted by one that
// accepts both; a node that knows only the old key refuses it.
func TestKeyRotation(t *testing.T) {
	oldK, newK := Key("old-key-old-key-old-key-old-key!"), Key("new-key-new-key-new-key-new-key!")
	b := Packet{Kind: KindBeacon, Subject: 1, Incarnation: 1, Seq: 1}.Seal(nil, newK)
	if _, err := Open(b, Keyring{Sign: oldK, Accept: []Key{newK}}); err != nil {
		t.Fatalf("accepting keyring refused the new key: %v", err)
	}
	if _, err := Open(b, Keyring{Sign: oldK}); !errors.Is(err, ErrBadMAC) {
		t.Fatalf("old-only keyring: %v", err)
	}
	if _, err := ParseKey("abcd"); err == nil {
		t.Fatal("short key accepted")
	}
	if _, err := ParseKey("zz" + strings.Repeat("00", 16)); err == nil {
		t.Fatal("non-hex key accepted")
	}
	k, err := ParseKey(newK.String())
	if err != nil || string(k) != string(newK) {
		t.Fatalf("key round trip: %v", err)
	}
}

// FuzzDecode: no input panics, and whatever opens re-seals to itself.
func FuzzDecode(f *testing.F) {
	f.Add(Packet{Kind: KindBeacon, Subject: 3, Incarnation: 7, Seq: 99}.Seal(nil, testKey))
	f.Add(Packet{Kind: KindEcho, Subject: 3, Incarnation: 7, Seq: 99, Observer: 1}.Seal(nil, testKey))
	f.Add([]byte("GFD2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if p, err := Decode(b); err == nil {
			var body [macOffset]byte = p.body()
			if string(body[:]) != string(b[:macOffset]) {
				t.Fatalf("decoded %+v re-encodes differently", p)
			}
		}
		p, err := Open(b, Keyring{Sign: testKey})
		if err != nil {
			return
		}
		if again := p.Seal(nil, testKey); string(again) != string(b) {
			t.Fatalf("opened %+v re-seals differently", p)
		}
	})
}

// The observer rejects beacons from unknown nodes, from incarnations other
// than the registered one, and replays, without changing its view; a dead
// answer is permanent once durable.
func TestObserverRejects(t *testing.T) {
	now := simNow()
	o := NewObserver(1, DefaultGracePeriod, now, nil)
	beacon := func(at time.Time, n NodeID, inc Incarnation, seq uint64) error {
		_, err := o.Beacon(at, Packet{Kind: KindBeacon, Subject: n, Incarnation: inc, Seq: seq})
		return err
	}
	if err := beacon(now, 2, 5, 1); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("before membership: %v", err)
	}
	o.SetRegistered(now, map[NodeID]Incarnation{1: 1, 2: 5, 3: 1})
	if err := beacon(now, 9, 1, 1); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("unknown node: %v", err)
	}
	if err := beacon(now, 2, 5, 1); err != nil {
		t.Fatal(err)
	}
	if err := beacon(now, 2, 4, 2); !errors.Is(err, ErrOldIncarnation) {
		t.Fatalf("old incarnation: %v", err)
	}
	if err := beacon(now, 2, 1_000_000, 2); !errors.Is(err, ErrUnregistered) {
		t.Fatalf("unregistered incarnation: %v", err)
	}
	later := now.Add(DefaultGracePeriod / 2)
	if err := beacon(later, 2, 5, 1); !errors.Is(err, ErrStaleSeq) {
		t.Fatalf("replayed beacon: %v", err)
	}
	if v := o.Views(later); len(v) != 3 || v[1].Incarnation != 5 || v[1].Silence != DefaultGracePeriod/2 {
		t.Fatalf("views changed by rejected beacons: %+v", v)
	}
	// Silence: condemned (not yet durable), then dead once durable.
	later = now.Add(2 * DefaultGracePeriod)
	if v := o.Query(later, later, 2, 5); v != VerdictCondemned {
		t.Fatalf("silent node: %v", v)
	}
	if err := beacon(later, 2, 5, 3); !errors.Is(err, ErrDeclaredDead) {
		t.Fatalf("condemned incarnation echoed: %v", err)
	}
	if v := o.Query(later, later, 2, 5); v != VerdictCondemned {
		t.Fatalf("second query before durability: %v", v)
	}
	tomb, _ := o.Tombstones()
	o.Durable(tomb)
	if v := o.Query(later, later, 2, 5); v != VerdictDead {
		t.Fatalf("after durability: %v", v)
	}
	// A restarted observer keeps refusing what is durable.
	o2 := NewObserver(1, DefaultGracePeriod, later, tomb)
	o2.SetRegistered(later, map[NodeID]Incarnation{2: 5})
	if _, err := o2.Beacon(later, Packet{Kind: KindBeacon, Subject: 2, Incarnation: 5, Seq: 9}); !errors.Is(err, ErrDeclaredDead) {
		t.Fatalf("restarted observer echoed a tombstoned incarnation: %v", err)
	}
	// A newly registered incarnation is welcome; the old one is dead.
	o.SetRegistered(later, map[NodeID]Incarnation{1: 1, 2: 6, 3: 1})
	if err := beacon(later, 2, 6, 1); err != nil {
		t.Fatal(err)
	}
	o.SetRegistered(later, map[NodeID]Incarnation{1: 1, 2: 6, 3: 2})
	if v := o.Query(later, later, 3, 1); v != VerdictAlive {
		t.Fatalf("superseded incarnation, just now: %v", v)
	}
	after := later.Add(DefaultGracePeriod + time.Millisecond)
	if v := o.Query(after, after, 3, 1); v != VerdictDead {
		t.Fatalf("superseded incarnation, GracePeriod later: %v", v)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Interval: DefaultInterval, GracePeriod: DefaultGracePeriod, MaxDrift: DefaultMaxDrift, Observers: []NodeID{1, 2, 3}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []Config{
		{Interval: 0, GracePeriod: time.Second, Observers: []NodeID{1}},
		{Interval: 500 * time.Millisecond, GracePeriod: time.Second, Observers: []NodeID{1}},
		{Interval: DefaultInterval, GracePeriod: time.Second, MaxDrift: 0.5, Observers: []NodeID{1}},
		{Interval: DefaultInterval, GracePeriod: time.Second, MaxDrift: 0, Observers: []NodeID{1}},      // below MinMaxDrift
		{Interval: DefaultInterval, GracePeriod: time.Second, MaxDrift: 0.0009, Observers: []NodeID{1}}, // below MinMaxDrift
		{Interval: DefaultInterval, GracePeriod: time.Second},
		{Interval: DefaultInterval, GracePeriod: time.Second, Observers: []NodeID{1, 1}},
	}
	for i, c := range bad {
		if c.Validate() == nil {
			t.Errorf("config %d accepted: %+v", i, c)
		}
	}
}

// A newly registered incarnation gets GracePeriod from when the observer
// learned of it, so a node that just registered is not declared dead before
// its first beacon arrives; then silence makes it dead as usual. An
// observer whose own contact with a majority is older than the subject's
// silence abstains.
func TestObserverNewIncarnationGraceAndGate(t *testing.T) {
	now := simNow()
	o := NewObserver(1, DefaultGracePeriod, now, nil)
	o.SetRegistered(now, map[NodeID]Incarnation{2: 1})
	o.Beacon(now, Packet{Kind: KindBeacon, Subject: 2, Incarnation: 1, Seq: 1})
	later := now.Add(10 * DefaultGracePeriod) // inc 1 long silent; inc 2 just registered
	o.SetRegistered(later, map[NodeID]Incarnation{2: 2, 3: 5})
	if v := o.Query(later, later, 2, 2); v != VerdictAlive {
		t.Fatalf("a just-registered incarnation: %v", v)
	}
	if _, err := o.Beacon(later.Add(time.Millisecond), Packet{Kind: KindBeacon, Subject: 2, Incarnation: 2, Seq: 1}); err != nil {
		t.Fatalf("its first beacon refused: %v", err)
	}
	if v := o.Query(later.Add(DefaultGracePeriod+time.Millisecond), later, 2, 1); v != VerdictDead {
		t.Fatalf("the old incarnation: %v", v)
	}
	if v := o.Query(later, later, 2, 3); v != VerdictAlive {
		t.Fatalf("an unregistered incarnation: %v", v)
	}
	// An incarnation that never beacons is condemned GracePeriod after the
	// observer learned of it, if the observer was in contact since.
	if v := o.Query(later.Add(DefaultGracePeriod/2), later.Add(DefaultGracePeriod/2), 3, 5); v != VerdictAlive {
		t.Fatalf("before GracePeriod: %v", v)
	}
	at := later.Add(DefaultGracePeriod + time.Millisecond)
	if v := o.Query(at, later.Add(DefaultGracePeriod/4), 3, 5); v != VerdictAbstain {
		t.Fatalf("stale contact: %v", v)
	}
	if v := o.Query(at, at, 3, 5); v != VerdictCondemned {
		t.Fatalf("a silent incarnation: %v", v)
	}
}

// Found by review: a node restarting once per GracePeriod must not keep its
// older incarnations "alive" forever: an older incarnation is timed from
// when the first registration newer than it was learned.
func TestSupersededTimedFromFirstNewer(t *testing.T) {
	now := simNow()
	o := NewObserver(1, DefaultGracePeriod, now, nil)
	o.SetRegistered(now, map[NodeID]Incarnation{2: 1})
	step := DefaultGracePeriod * 9 / 10
	for i := 2; i <= 5; i++ {
		now = now.Add(step)
		o.SetRegistered(now, map[NodeID]Incarnation{2: Incarnation(i)})
	}
	// Incarnation 1 stopped being echoed when 2 was learned, 3.6 s ago.
	if v := o.Query(now, now, 2, 1); v != VerdictDead {
		t.Fatalf("incarnation 1, long superseded: %v", v)
	}
	if v := o.Query(now, now, 2, 4); v != VerdictAlive {
		t.Fatalf("incarnation 4, superseded just now: %v", v)
	}
}

// Found by review: at the joining rate, an echo that takes up to SelfGrace
// must still match a beacon in the subject's window.
func TestJoiningEchoWindow(t *testing.T) {
	cfg := Config{Interval: DefaultInterval, GracePeriod: DefaultGracePeriod, MaxDrift: DefaultMaxDrift, Observers: []NodeID{1, 2, 3}}
	now := simNow()
	s := NewSubject(cfg, 1, 1, now)
	first, _, _ := s.Tick(now)
	for t := now; t.Before(now.Add(700 * time.Millisecond)); t = t.Add(DefaultInterval / 8) {
		s.Tick(t)
	}
	at := now.Add(700 * time.Millisecond) // a 700 ms round trip
	for _, o := range []NodeID{1, 2} {
		if err := s.Echo(at, Packet{Kind: KindEcho, Subject: 1, Incarnation: 1, Seq: first.Seq, Observer: o}); err != nil {
			t.Fatalf("echo of the first beacon after 700 ms: %v", err)
		}
	}
	if !s.Alive(at) {
		t.Fatal("not alive after a majority echoed")
	}
}

// Found by the fault suite: an observer cut off together from every node
// (its host isolated) regains contact with a majority when the partition
// heals, and was asked at once about a node whose next beacon had not
// arrived yet: it condemned a live incarnation, permanently. Silence counts
// only from the start of the observer's current run of contact.
func TestObserverSilenceCountsFromReconnection(t *testing.T) {
	now := simNow()
	o := NewObserver(1, DefaultGracePeriod, now, nil)
	o.SetRegistered(now, map[NodeID]Incarnation{2: 1})
	o.Beacon(now, Packet{Kind: KindBeacon, Subject: 2, Incarnation: 1, Seq: 1})
	healed := now.Add(4 * time.Second) // cut off from now until healed
	contact := healed.Add(5 * time.Millisecond)
	if v := o.QueryConnected(contact, contact, healed, 2, 1); v != VerdictAbstain {
		t.Fatalf("asked right after the heal: %v, want abstain", v)
	}
	if v := o.QueryConnected(contact, contact, time.Time{}, 2, 1); v != VerdictCondemned {
		t.Fatalf("teeth: without the run's start the same question condemns: %v", v)
	}
	o2 := NewObserver(1, DefaultGracePeriod, now, nil)
	o2.SetRegistered(now, map[NodeID]Incarnation{2: 1})
	o2.Beacon(now, Packet{Kind: KindBeacon, Subject: 2, Incarnation: 1, Seq: 1})
	later := healed.Add(DefaultGracePeriod / 2)
	if v := o2.QueryConnected(later, later, healed, 2, 1); v != VerdictCondemned {
		t.Fatalf("still silent GracePeriod/2 into the observer's contact: %v, want condemned", v)
	}
}

// The Subject's contact began with the first majority acknowledgement of
// the incarnation and does not move with later contacts, even after a gap
// (a node on a bursty link must still be able to condemn: found by review).
func TestSubjectContactSince(t *testing.T) {
	cfg := Config{Interval: DefaultInterval, GracePeriod: DefaultGracePeriod, MaxDrift: DefaultMaxDrift, Observers: []NodeID{1, 2, 3}}
	now := simNow()
	s := NewSubject(cfg, 1, 1, now)
	ack := func(at time.Time) {
		t.Helper()
		b, send, _ := s.Tick(at)
		if !send {
			t.Fatalf("no beacon due at %v", at.Sub(now))
		}
		for _, o := range []NodeID{1, 2} {
			if err := s.Echo(at, Packet{Kind: KindEcho, Subject: 1, Incarnation: 1, Seq: b.Seq, Observer: o}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ack(now)
	if c, since, ok := s.Contact(now); !ok || !c.Equal(now) || !since.Equal(now) {
		t.Fatalf("first contact: %v %v %v", c.Sub(now), since.Sub(now), ok)
	}
	t1 := now.Add(DefaultInterval)
	ack(t1)
	t2 := t1.Add(DefaultGracePeriod * 3 / 4) // a gap, but within SelfGrace: still alive
	ack(t2)
	if c, since, ok := s.Contact(t2); !ok || !c.Equal(t2) || !since.Equal(now) {
		t.Fatalf("after a gap: contact %v since %v ok %v", c.Sub(now), since.Sub(now), ok)
	}
}
