package btree

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/grovestore/grove/internal/lock"
)

// droppingStore mimics TreeStore's drop checks over a MemStore (Anchor and
// LockAnchor answer ErrNoTree once the anchor is marked dropped) and runs
// hook once, just before the first exclusive node lock: the moment a drop
// (markDropped, then finishDrop's dropOrder walk) runs on another server
// while this operation is past the anchor.
type droppingStore struct {
	*MemStore
	once sync.Once
	hook func()
}

func (d *droppingStore) Anchor(ctx context.Context) (*Anchor, error) {
	a, err := d.MemStore.Anchor(ctx)
	if err == nil && a.Dropped {
		return nil, ErrNoTree
	}
	return a, err
}

func (d *droppingStore) LockAnchor(ctx context.Context) (*Anchor, error) {
	a, err := d.MemStore.LockAnchor(ctx)
	if err == nil && a.Dropped {
		d.MemStore.Unlock(a.Self, lock.Exclusive)
		return nil, ErrNoTree
	}
	return a, err
}

func (d *droppingStore) Lock(ctx context.Context, h Handle, mode lock.Mode) (*Node, error) {
	if mode == lock.Exclusive && d.hook != nil {
		d.once.Do(d.hook)
	}
	return d.MemStore.Lock(ctx, h, mode)
}

// An outside review's finding: an operation that read the anchor before a
// drop marked it may still commit afterwards, a split's new chunk
// included; a walk made right after the mark misses that chunk (it leaked).
// Such an operation is concurrent with the drop (it linearizes before it),
// and it ends within its deadline: drops are now walked DropWait after
// their mark, when every operation that began before has ended. The walk
// below is made at that point: it finds every chunk.
func TestReview3DropMissesInFlightSplit(t *testing.T) {
	ctx := context.Background()
	ms, id := NewMemStore(nil)
	var order []Handle
	var anchor Handle
	ds := &droppingStore{MemStore: ms}
	tr, err := New(ds, id, Config{MaxFanout: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := tr.Put(ctx, []byte(fmt.Sprintf("k%d", i)), []byte("v"), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	ds.once = sync.Once{}
	ds.hook = func() {
		// markDropped (another server).
		a, err := ms.LockAnchor(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		na := a.Clone()
		na.Dropped = true
		if _, err := ms.Commit(ctx, nil, na, nil); err != nil {
			t.Error(err)
		}
		ms.Unlock(a.Self, lock.Exclusive)
		anchor = a.Self
	}
	if _, err := tr.Put(ctx, []byte("k9"), []byte("v"), Cond{}); err != nil {
		t.Logf("the put in flight at the drop's mark: %v", err)
	}
	// DropWait later: the in-flight put is over; no operation starts on the
	// dropped tree.
	if _, err := tr.Put(ctx, []byte("k10"), []byte("v"), Cond{}); err == nil {
		t.Fatal("a put began on a dropped tree")
	}
	a, err := ms.Anchor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	order, err = dropOrder(ctx, ms, a)
	if err != nil {
		t.Fatal(err)
	}
	freed := map[Handle]bool{anchor: true}
	for _, h := range order {
		freed[h] = true
	}
	for h := range ms.Chunks() {
		if !freed[h] {
			t.Errorf("chunk %v (a split committed after the drop walked its level) is in no drop order: it leaks", h)
		}
	}
}
