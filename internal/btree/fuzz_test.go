package btree

import (
	"bytes"
	"testing"
)

func sampleImages() [][]byte {
	leaf := &Node{Self: Handle{CM: 1, ID: 7}, Tree: 3, LSN: 9, Low: []byte("b"), High: []byte("m"), Right: Handle{CM: 1, ID: 8},
		Keys: [][]byte{[]byte("b"), []byte("c")}, Vals: [][]byte{[]byte("1"), {}},
		Garbage: []Garbage{{Node: Handle{CM: 2, ID: 5}, Deadline: 77}}}
	inner := &Node{Self: Handle{CM: 1, ID: 9}, Tree: 3, Level: 2, HighInf: true,
		Keys: [][]byte{nil, []byte("k")}, Kids: []Handle{{CM: 1, ID: 7}, {CM: 1, ID: 8}}}
	gone := &Node{Self: Handle{CM: 1, ID: 8}, Tree: 3, Deleted: true, Onward: Handle{CM: 1, ID: 7}, Low: []byte("m"), HighInf: true}
	a := &Anchor{Self: Handle{CM: 1, ID: 3}, Leftmost: []Handle{{CM: 1, ID: 7}, {CM: 1, ID: 9}}}
	return [][]byte{leaf.Encode(nil), inner.Encode(nil), gone.Encode(nil), a.Encode(nil)}
}

// FuzzDecodeNode: any bytes either decode to an image that encodes back to
// the same bytes, or are refused with an error; never a panic.
func FuzzDecodeNode(f *testing.F) {
	for _, b := range sampleImages() {
		f.Add(b)
		f.Add(append(b, 0, 0, 0))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := decode(b); err == nil {
			if err := n.Check(); err != nil {
				t.Fatalf("decoded an image that fails its check: %v", err)
			}
			length := len(n.Encode(nil))
			if !bytes.Equal(n.Encode(nil), b[:length]) || n.Size() != length {
				t.Fatalf("re-encoding differs (size %d, encoded %d)", n.Size(), length)
			}
		}
		if len(b) >= 24 {
			if a, err := DecodeAnchor(b, getHandle(b[12:])); err == nil {
				if !bytes.Equal(a.Encode(nil), b[:len(a.Encode(nil))]) {
					t.Fatal("anchor re-encoding differs")
				}
			}
		}
	})
}

func TestNodeRoundTrip(t *testing.T) {
	for _, b := range sampleImages()[:3] {
		n, err := decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if n.Size() != len(b) {
			t.Fatalf("size %d, image %d bytes", n.Size(), len(b))
		}
		for i := 12; i < len(b); i++ { // every flipped bit is caught
			c := bytes.Clone(b)
			c[i] ^= 0x10
			if _, err := decode(c); err == nil {
				t.Fatalf("a flip at byte %d decoded", i)
			}
		}
		if _, err := decode(b[:len(b)-1]); err == nil {
			t.Fatal("a torn image decoded")
		}
		if _, err := Decode(b, n.Tree, Handle{CM: 5, ID: 5}); err == nil {
			t.Fatal("a misdirected image decoded")
		}
	}
}
