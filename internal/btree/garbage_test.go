package btree

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Deleting every key with compression after each delete and a grace period
// longer than the run fills the garbage lists: merges are declined and the
// pair is rebalanced instead, down to pairs with one entry between them
// (an empty left node and a right node of one key). `grove bench tree`'s
// delete phase found a rebalance of such a pair panicking (an empty right
// half).
func TestDeleteAllWithFullGarbage(t *testing.T) {
	for _, fan := range []int{4, 6} {
		t.Run(fmt.Sprintf("fanout=%d", fan), func(t *testing.T) {
			var hints [][2]any
			cfg := Config{MaxFanout: fan, Grace: time.Hour, MaxScanLeaves: 8, MaxCountLeaves: 1 << 20,
				Underfull: func(level int, key []byte) { hints = append(hints, [2]any{level, append([]byte(nil), key...)}) }}
			tr, s, _ := newMemTree(t, cfg)
			ctx := context.Background()
			const n = 1500
			key := func(i int) []byte { return []byte(fmt.Sprintf("%010d", (i*7919)%n)) }
			for i := 0; i < n; i++ {
				if _, err := tr.Put(ctx, key(i), []byte("v"), Cond{}); err != nil {
					t.Fatal(err)
				}
			}
			m := model{}
			for i := 0; i < n; i++ {
				m[string(key(i))] = "v"
			}
			for _, order := range [][2]int{{0, n / 2}, {n - 1, n / 2}} { // half from each end
				for i := order[0]; i != order[1]; {
					if _, err := tr.Delete(ctx, key(i), Cond{}); err != nil {
						t.Fatal(err)
					}
					delete(m, string(key(i)))
					for len(hints) > 0 {
						h := hints[0]
						hints = hints[1:]
						if _, err := tr.Compress(ctx, h[0].(int), h[1].([]byte)); err != nil {
							t.Fatal(err)
						}
					}
					if order[0] < order[1] {
						i++
					} else {
						i--
					}
				}
			}
			if _, err := tr.Repair(ctx); err != nil {
				t.Fatal(err)
			}
			checkShape(t, s, m, false)
		})
	}
}
