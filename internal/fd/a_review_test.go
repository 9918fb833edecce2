package fd

import (
	"testing"
	"time"
)

// A restarted observer forgets maxSeq: a captured beacon of a node that has
// since crashed, replayed by someone without the key, is echoed and resets
// the silence clock, postponing the dead verdict (once per captured beacon).
func TestReviewReplayAfterObserverRestart(t *testing.T) {
	now := simNow()
	o := NewObserver(1, DefaultGracePeriod, now, nil)
	o.SetRegistered(now, map[NodeID]Incarnation{2: 1})
	var captured [][]byte
	for s := uint64(1); s <= 50; s++ {
		p := Packet{Kind: KindBeacon, Subject: 2, Incarnation: 1, Seq: s}
		captured = append(captured, p.Seal(nil, testKey))
		o.Beacon(now, p)
	}
	// Node 2 crashes. Observer 1 restarts (its tombstones are empty: nothing condemned).
	t1 := now.Add(time.Second)
	o2 := NewObserver(1, DefaultGracePeriod, t1, nil)
	o2.SetRegistered(t1, map[NodeID]Incarnation{2: 1})
	at := t1
	for i, b := range captured {
		at = t1.Add(time.Duration(i+1) * 900 * time.Millisecond)
		p, err := Open(b, Keyring{Sign: testKey})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := o2.Beacon(at, p); err != nil {
			t.Fatalf("replay %d refused: %v", i, err)
		}
	}
	if v := o2.Query(at.Add(500*time.Millisecond), at.Add(500*time.Millisecond), 2, 1); v == VerdictAlive {
		t.Logf("BUG: %v after replaying 50 captured beacons for %v: a crashed node kept 'alive' by replays", v, at.Sub(t1))
	}
}
