package fd

import (
	"errors"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/sim"
)

func simNow() time.Time { return sim.Epoch }

func TestPacketRoundTrip(t *testing.T) {
	for _, p := range []Packet{
		{Kind: KindBeacon, Subject: 3, Incarnation: 7, Seq: 99},
		{Kind: KindEcho, Subject: 1, Incarnation: 1, Seq: 1 << 60, Observer: 2},
	} {
		got, err := Decode(p.Encode(nil))
		if err != nil || got != p {
			t.Fatalf("round trip of %+v: got %+v, %v", p, got, err)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good := Packet{Kind: KindBeacon, Subject: 3, Incarnation: 7, Seq: 99}.Encode(nil)
	flip := func(i int) []byte { b := append([]byte(nil), good...); b[i] ^= 0x40; return b }
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrShortPacket},
		{"truncated", good[:PacketSize-1], ErrShortPacket},
		{"long", append(append([]byte(nil), good...), 0), ErrShortPacket},
		{"magic", flip(0), ErrBadMagic},
		{"payload bit flip", flip(20), ErrBadChecksum},
		{"kind", Packet{Kind: 9, Subject: 1, Incarnation: 1}.Encode(nil), ErrBadKind},
		{"zero subject", Packet{Kind: KindBeacon, Incarnation: 1}.Encode(nil), ErrBadField},
		{"zero incarnation", Packet{Kind: KindBeacon, Subject: 1}.Encode(nil), ErrBadField},
		{"echo without observer", Packet{Kind: KindEcho, Subject: 1, Incarnation: 1}.Encode(nil), ErrBadField},
		{"beacon with observer", Packet{Kind: KindBeacon, Subject: 1, Incarnation: 1, Observer: 2}.Encode(nil), ErrBadField},
	}
	for _, c := range cases {
		if _, err := Decode(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzDecode: no input panics, and whatever decodes re-encodes to itself.
func FuzzDecode(f *testing.F) {
	f.Add(Packet{Kind: KindBeacon, Subject: 3, Incarnation: 7, Seq: 99}.Encode(nil))
	f.Add(Packet{Kind: KindEcho, Subject: 3, Incarnation: 7, Seq: 99, Observer: 1}.Encode(nil))
	f.Add([]byte("GFD1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Decode(b)
		if err != nil {
			return
		}
		if again := p.Encode(nil); string(again) != string(b) {
			t.Fatalf("decoded %+v re-encodes differently", p)
		}
	})
}

// The observer rejects beacons from unknown nodes and old or declared-dead
// incarnations without changing its view.
func TestObserverRejects(t *testing.T) {
	now := simNow()
	o := NewObserver(1, DefaultGracePeriod, now, nil, func(n NodeID) bool { return n <= 3 })
	if _, err := o.Beacon(now, Packet{Kind: KindBeacon, Subject: 9, Incarnation: 1, Seq: 1}); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("unknown node: %v", err)
	}
	if _, err := o.Beacon(now, Packet{Kind: KindBeacon, Subject: 2, Incarnation: 5, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Beacon(now, Packet{Kind: KindBeacon, Subject: 2, Incarnation: 4, Seq: 2}); !errors.Is(err, ErrOldIncarnation) {
		t.Fatalf("old incarnation: %v", err)
	}
	if v := o.Views(now); len(v) != 1 || v[0].Incarnation != 5 {
		t.Fatalf("views changed by rejected beacons: %+v", v)
	}
	// A dead answer is permanent: a tombstone to persist, then refusal.
	later := now.Add(2 * DefaultGracePeriod)
	dead, persist := o.Query(later, 2, 5)
	if !dead || !persist {
		t.Fatalf("silent node: dead=%v persist=%v", dead, persist)
	}
	if _, err := o.Beacon(later, Packet{Kind: KindBeacon, Subject: 2, Incarnation: 5, Seq: 3}); !errors.Is(err, ErrDeclaredDead) {
		t.Fatalf("declared-dead incarnation echoed: %v", err)
	}
	if dead, persist := o.Query(later, 2, 5); !dead || persist {
		t.Fatalf("second query: dead=%v persist=%v", dead, persist)
	}
	// A new incarnation is welcome.
	if _, err := o.Beacon(later, Packet{Kind: KindBeacon, Subject: 2, Incarnation: 6, Seq: 1}); err != nil {
		t.Fatal(err)
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
		{Interval: DefaultInterval, GracePeriod: time.Second},
		{Interval: DefaultInterval, GracePeriod: time.Second, Observers: []NodeID{1, 1}},
	}
	for i, c := range bad {
		if c.Validate() == nil {
			t.Errorf("config %d accepted: %+v", i, c)
		}
	}
}

// A never-heard incarnation gets GracePeriod from the first question about
// it, so a node that just registered is not declared dead before its first
// beacon arrives; then silence makes it dead as usual.
func TestObserverNewIncarnationGrace(t *testing.T) {
	now := simNow()
	o := NewObserver(1, DefaultGracePeriod, now, nil, func(NodeID) bool { return true })
	o.Beacon(now, Packet{Kind: KindBeacon, Subject: 2, Incarnation: 1, Seq: 1})
	later := now.Add(10 * DefaultGracePeriod) // inc 1 long silent; inc 2 just registered
	if dead, _ := o.Query(later, 2, 2); dead {
		t.Fatal("a just-registered incarnation declared dead before it could be heard")
	}
	if _, err := o.Beacon(later.Add(time.Millisecond), Packet{Kind: KindBeacon, Subject: 2, Incarnation: 2, Seq: 1}); err != nil {
		t.Fatalf("its first beacon refused: %v", err)
	}
	if dead, _ := o.Query(later, 2, 1); !dead {
		t.Fatal("the old incarnation is not dead")
	}
	// An incarnation that never beacons is dead GracePeriod after the first question.
	o.Query(later, 3, 5)
	if dead, _ := o.Query(later.Add(DefaultGracePeriod/2), 3, 5); dead {
		t.Fatal("dead before GracePeriod from the first question")
	}
	if dead, _ := o.Query(later.Add(DefaultGracePeriod+time.Millisecond), 3, 5); !dead {
		t.Fatal("a silent incarnation never declared dead")
	}
}
