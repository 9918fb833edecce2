package main

import (
	"strings"
	"testing"

	"github.com/grovestore/grove/internal/node"
)

// TestUpDisks: --disks gives each store node that many disk files; a later
// run with more adds them to the existing cluster's node configs, with
// fewer is refused (grove up never drops a disk that may hold segments).
func TestUpDisks(t *testing.T) {
	o := upOptions{nodes: 3, members: 1, data: t.TempDir(), basePort: 21000, host: "127.0.0.1", readyWait: 1,
		logLevel: "info", logFormat: "text", diskSize: 64 << 20, disks: 2, dataPath: "tcp"}
	if err := checkUpFlags(o); err != nil {
		t.Fatal(err)
	}
	disks := func(o upOptions) [][]string {
		t.Helper()
		cfgs, paths, _, _, err := layout(o)
		if err != nil {
			t.Fatal(err)
		}
		var out [][]string
		for _, p := range paths { // as written
			c, err := node.ReadConfig(p)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, c.Disks)
		}
		if len(out) != len(cfgs) {
			t.Fatalf("%d configs, %d files", len(cfgs), len(out))
		}
		return out
	}
	for _, ds := range disks(o) {
		if strings.Join(ds, ",") != "disk0.img,disk1.img" {
			t.Fatalf("a new cluster with --disks 2: %v", ds)
		}
	}
	o.changed = func(f string) bool { return f == "disks" }
	o.disks = 3
	for _, ds := range disks(o) {
		if strings.Join(ds, ",") != "disk0.img,disk1.img,disk2.img" {
			t.Fatalf("--disks 3 on it: %v", ds)
		}
	}
	o.changed = nil
	o.disks = 1 // the default, not given: the cluster keeps its disks
	for _, ds := range disks(o) {
		if len(ds) != 3 {
			t.Fatalf("a run without --disks: %v", ds)
		}
	}
	o.changed = func(f string) bool { return f == "disks" }
	if _, _, _, _, err := layout(o); err == nil || !strings.Contains(err.Error(), "never removes one") {
		t.Fatalf("--disks 1 on a cluster with 3: %v", err)
	}
	o.disks = 0
	if err := checkUpFlags(o); err == nil || !strings.Contains(err.Error(), "--disks 0") {
		t.Fatalf("--disks 0: %v", err)
	}
}

// TestUpSmallDiskDefaultChunkSize: a small --disk-size with the default
// --chunk-size is accepted (the default shrinks to a disk's eighth); a
// --chunk-size asked for that the disks cannot hold is refused.
func TestUpSmallDiskDefaultChunkSize(t *testing.T) {
	o := upOptions{nodes: 3, members: 1, data: t.TempDir(), basePort: 21000, host: "127.0.0.1", readyWait: 1,
		logLevel: "info", logFormat: "text", diskSize: 2 << 30, disks: 1, dataPath: "tcp", chunkSize: DefaultChunkSize}
	o.changed = func(string) bool { return false }
	if err := checkUpFlags(o); err != nil {
		t.Fatalf("--disk-size 2GiB with the default chunk size: %v", err)
	}
	o.changed = func(f string) bool { return f == "chunk-size" }
	if err := checkUpFlags(o); err == nil || !strings.Contains(err.Error(), "--chunk-size") {
		t.Fatalf("--chunk-size 1GiB asked for on 2GiB disks: %v", err)
	}
}
