package btree_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/btree"
)

// BenchmarkCheckpointWriteBack measures a checkpoint's write-back on the
// real stack (three in-process nodes, chunks on RLDevs with their disks in
// files): each round dirties every leaf of a tree of about 300 leaves
// (one put per leaf), then FlushAll writes them back, one at a time or
// several at once (the RLDevs share a sync among the writes in flight).
// Reported: nanoseconds per node written back.
func BenchmarkCheckpointWriteBack(b *testing.B) {
	for _, par := range []int{1, 16} {
		b.Run(fmt.Sprintf("parallel=%d", par), func(b *testing.B) {
			defer btree.SetWriteBackParallelForTest(par)()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			tc := startCluster(b, ctx)
			s := tc.server(b, ctx, 0)
			if _, err := s.CreateTree(ctx, "wb", btree.Config{}); err != nil {
				b.Fatal(err)
			}
			tr, err := s.Open(ctx, "wb")
			if err != nil {
				b.Fatal(err)
			}
			const keys = 6000
			val := make([]byte, 256)
			for i := 0; i < keys; i++ {
				if _, err := tr.Put(ctx, []byte(fmt.Sprintf("key%08d", i)), val, btree.Cond{}); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.Cache().FlushAll(ctx); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			written := 0
			for n := 0; n < b.N; n++ {
				b.StopTimer()
				for i := 0; i < keys; i += 20 {
					if _, err := tr.Put(ctx, []byte(fmt.Sprintf("key%08d", i)), val, btree.Cond{}); err != nil {
						b.Fatal(err)
					}
				}
				dirty := s.Cache().Dirty()
				b.StartTimer()
				if err := s.Cache().FlushAll(ctx); err != nil {
					b.Fatal(err)
				}
				written += dirty
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(written, 1)), "ns/node")
		})
	}
}
