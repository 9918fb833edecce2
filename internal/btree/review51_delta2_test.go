package btree

// Outside review 51 of c97fd28 (two-part node deltas, GBD2, and the
// records section's count and offset trailing a GBN2 image).

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand"
	"testing"

	"github.com/grovestore/grove/internal/lock"
)

// r51Pair is a leaf with records and its next image (a put: a value
// replaced and a record added, sometimes one aged out too).
func r51Pair(r *rand.Rand) (base, next *Node) {
	base = deltaLeaf(r, 4+r.Intn(24), 40+r.Intn(200), uint64(1+r.Intn(100)))
	for j := 0; j < 1+r.Intn(30); j++ {
		base.addDone(Completion{Key: base.Keys[r.Intn(len(base.Keys))], Client: [16]byte{byte(j)}, Seq: uint64(j + 1), Stamp: int64(j + 1)})
	}
	if r.Intn(4) == 0 {
		base.Horizon = 9
	}
	next = base.Clone()
	next.Version = base.Version + 1
	next.LSN = base.LSN + 5
	i := r.Intn(len(base.Keys))
	val := make([]byte, len(base.Vals[i])+r.Intn(3)-1)
	r.Read(val)
	next.Vals[i] = val
	next.addDone(Completion{Key: next.Keys[i], Client: [16]byte{200}, Seq: 7, Stamp: 99, Applied: true})
	if r.Intn(3) == 0 {
		next.Done = next.Done[1:]
	}
	return base, next
}

// A GBD2 delta applied to anything of its base's version and length that
// is not its base's body either is refused or rebuilds the next image
// byte for byte: bases cut elsewhere (the trailer's offset moved, a value
// lengthened by as many bytes as the records lost), a flipped byte
// anywhere, a header of another LSN and token.
func TestReview51WrongBaseSameLength(t *testing.T) {
	r := rand.New(rand.NewSource(51))
	refused, same, twoPart := 0, 0, 0
	for trial := 0; trial < 400; trial++ {
		base, next := r51Pair(r)
		b, n := base.Encode(nil), next.Encode(nil)
		d, ok := makeDelta(b, n)
		if !ok || string(d[:4]) != deltaMagic2 {
			continue
		}
		twoPart++
		if got, err := applyDelta(b, d, true); err != nil || !bytes.Equal(got, n) {
			t.Fatalf("trial %d: its own base: %v", trial, err)
		}
		var wrong [][]byte
		// The same bytes, the trailer's offset moved (every in-range value).
		ob := doneOffset(b)
		for off := headerSize; off <= len(b)-4-doneOverhead; off++ {
			if off == ob {
				continue
			}
			w := bytes.Clone(b)
			binary.LittleEndian.PutUint32(w[len(w)-8:], uint32(off))
			wrong = append(wrong, w)
		}
		// A node of the same length and version cut elsewhere: a value
		// k bytes longer, a record's key k bytes shorter.
		for k := 1; k <= 3; k++ {
			o := base.Clone()
			for ri := range o.Done {
				if len(o.Done[ri].Key) > k {
					o.Done[ri].Key = o.Done[ri].Key[:len(o.Done[ri].Key)-k]
					o.Vals[0] = append(bytes.Clone(o.Vals[0]), make([]byte, k)...)
					w := o.Encode(nil)
					if len(w) == len(b) && doneOffset(w) != ob {
						wrong = append(wrong, w)
					}
					break
				}
			}
		}
		// One byte flipped anywhere past the magic and length.
		for i := 0; i < 64; i++ {
			w := bytes.Clone(b)
			j := 8 + r.Intn(len(w)-8)
			w[j] ^= byte(1 + r.Intn(255))
			if binary.LittleEndian.Uint32(w[4:]) != uint32(len(b)) || binary.LittleEndian.Uint64(w[84:]) != base.Version {
				continue
			}
			wrong = append(wrong, w)
		}
		// The write-back's header.
		wb := *base
		wb.LSN, wb.Token = base.LSN+100, lock.Token{Epoch: 3, Seq: 9}
		wrong = append(wrong, wb.Encode(nil))
		for wi, w := range wrong {
			for _, exact := range []bool{false, true} {
				got, err := applyDelta(w, d, exact)
				switch {
				case err != nil:
					refused++
				case bytes.Equal(got, n):
					same++
				default:
					t.Fatalf("trial %d, wrong base %d (exact %v): applied to a valid image that is not the delta's next", trial, wi, exact)
				}
			}
		}
	}
	t.Logf("%d two-part deltas; wrong bases: %d refused, %d rebuilt the next image exactly", twoPart, refused, same)
}

// GBN1 -> GBN2 (a leaf's first record) and GBN2 -> GBN1 (its last record
// and its horizon gone), and GBN2 -> GBN2 with every record replaced:
// whichever delta makeDelta picks rebuilds the next image, from the base
// and from its write-back.
func TestReview51VersionTransitions(t *testing.T) {
	r := rand.New(rand.NewSource(52))
	for trial := 0; trial < 300; trial++ {
		base, next := r51Pair(r)
		switch trial % 3 {
		case 0:
			base.Done, base.Horizon = nil, 0
		case 1:
			next.Done, next.Horizon = nil, 0
		case 2:
			next.Done = []Completion{{Key: next.Keys[0], Seq: 1000, Stamp: 1}}
		}
		b, n := base.Encode(nil), next.Encode(nil)
		d, ok := makeDelta(b, n)
		if !ok {
			continue
		}
		if trial%3 != 2 && string(d[:4]) == deltaMagic2 {
			t.Fatalf("trial %d: a two-part delta across versions 1 and 2", trial)
		}
		wb := *base
		wb.LSN, wb.Token = base.LSN+100, lock.Token{Epoch: 3, Seq: 9}
		for _, c := range []struct {
			b     []byte
			exact bool
		}{{b, true}, {wb.Encode(nil), false}} {
			got, err := applyDelta(c.b, d, c.exact)
			if err != nil || !bytes.Equal(got, n) {
				t.Fatalf("trial %d (%s): %v", trial, d[:4], err)
			}
		}
	}
}

// FuzzReview51Delta2 reaches what FuzzNodeDelta does not: its GBD2 seed is
// applied only to a version 1 base (refused at doneOffset), so the
// two-part splice never runs there. Here any bytes are a delta onto a
// version 2 base, or a base under a GBD2 delta; an image applyDelta
// returns must decode, and from a base the delta's next image exactly.
func FuzzReview51Delta2(f *testing.F) {
	r := rand.New(rand.NewSource(53))
	var b, n, d []byte
	for {
		base, next := r51Pair(r)
		b, n = base.Encode(nil), next.Encode(nil)
		var ok bool
		if d, ok = makeDelta(b, n); ok && string(d[:4]) == deltaMagic2 {
			break
		}
	}
	f.Add(d, false)
	f.Add(b, true)
	wb, _ := decode(b)
	wb.LSN++
	f.Add(wb.Encode(nil), true)
	f.Fuzz(func(t *testing.T, data []byte, asBase bool) {
		if asBase {
			out, err := applyDelta(data, d, len(data)%2 == 0)
			if err == nil && !bytes.Equal(out, n) {
				t.Fatalf("a base that is not the delta's made another valid image")
			}
			return
		}
		out, err := applyDelta(b, data, true)
		if err == nil {
			if _, derr := decode(out); derr != nil {
				t.Fatalf("applyDelta returned an image that does not decode: %v", derr)
			}
		}
	})
}

// On a 32-bit build (int is 32 bits) the first middle's length is the one
// u32 of a GBD2 header not checked for a negative int: applyDelta slices
// mids[:m1] with m1 < 0 and panics. On 64-bit it is refused.
// GOARCH=386 go test ./internal/btree/ -run TestReview51NegativeMiddle
func TestReview51NegativeMiddle(t *testing.T) {
	r := rand.New(rand.NewSource(55))
	for {
		base, next := r51Pair(r)
		b, n := base.Encode(nil), next.Encode(nil)
		d, ok := makeDelta(b, n)
		if !ok || string(d[:4]) != deltaMagic2 {
			continue
		}
		d = bytes.Clone(d)
		binary.LittleEndian.PutUint32(d[36:], 0xFFFFFFF0)
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("applyDelta panicked on a hostile middle length: %v", p)
			}
		}()
		if _, err := applyDelta(b, d, true); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("a hostile middle length: %v", err)
		}
		return
	}
}
