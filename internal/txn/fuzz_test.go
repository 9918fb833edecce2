package txn

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/grovestore/grove/internal/lock"
)

// The log's decoders read what is on the RLDev after a crash: a torn,
// stale, foreign or flipped block must be refused with an error (or end
// the scan), never panic, and what they accept must encode back to the
// same value.

func FuzzDecodeLog(f *testing.F) {
	tok := lock.Token{Epoch: 2, Seq: 7}
	rec := AppendRecord(nil, &Record{Kind: KindUpdate, Txn: 3, Target: []byte("chunk"), Off: 9, Redo: []byte("new"), Undo: []byte("old")})
	rec = AppendRecord(rec, &Record{Kind: KindCommit, Txn: 3})
	f.Add(rec)
	f.Add(EncodeHeader(Header{Gen: 4, Floor: tok, Head: 4056, Ring: 13, Writer: lock.Token{Epoch: 2, Seq: 9}}))
	for _, b := range BuildFlush(1, tok, rec, []int{0}) {
		f.Add(b)
	}
	big := AppendRecord(nil, &Record{Kind: KindUpdate, Txn: 4, Target: []byte("c"), Redo: make([]byte, 5000), Undo: make([]byte, 5000)})
	f.Add(bytes.Join(BuildFlush(1, tok, big, []int{0}), nil))
	f.Add(make([]byte, BlockSize))
	f.Add(EncodeEntry(Entry{Name: "boxfs", RLDev: 3, Blocks: 256}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, err := DecodeEntry(b); err == nil {
			if got, err := DecodeEntry(EncodeEntry(e)); err != nil || got != e {
				t.Fatalf("log entry %+v: round trip %+v, %v", e, got, err)
			}
		}
		if r, err := DecodeRecord(b); err == nil {
			if got := AppendRecord(nil, &r); !bytes.Equal(got, b) {
				t.Fatalf("record %+v: encodes to %x, decoded from %x", r, got, b)
			}
		}
		if h, err := DecodeHeader(b); err == nil {
			got, err := DecodeHeader(EncodeHeader(h))
			if err != nil || got != h {
				t.Fatalf("header %+v: round trip %+v, %v", h, got, err)
			}
		}
		if len(b) >= BlockSize {
			if k, err := DecodeBlock(b[:BlockSize]); err == nil {
				got, err := DecodeBlock(EncodeBlock(k.Seq, k.Token, k.First, k.Data))
				if err != nil || !reflect.DeepEqual(got, k) {
					t.Fatalf("block %+v: round trip %+v, %v", k, got, err)
				}
			}
		}
		// A scan over whatever the input holds, as blocks from seq 1.
		s := NewScanner(Header{Floor: tok, Head: LSNOf(1, 0), Ring: 8})
		for off := 0; off < len(b) && s.Wanted() > 0; off += BlockSize {
			blk := make([]byte, BlockSize)
			copy(blk, b[off:])
			if !s.Feed(blk) {
				break
			}
		}
		res := s.Result()
		if res.End > res.Next || res.Blocks > 8 {
			t.Fatalf("scan result %+v", res)
		}
		for _, r := range res.Records {
			if err := r.Check(); err != nil {
				t.Fatalf("the scan returned a record that fails its check: %v", err)
			}
		}
		_ = Analyze(res.Records)
	})
}
