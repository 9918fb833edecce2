// Package ddstable is DDS's distributed hash table (Gribble, Brewer,
// Hellerstein and Culler, OSDI 2000, §4): named tables of 64-bit keys and
// byte-string values, partitioned by a DP-map trie over the keys' low bits,
// each partition replicated on a replica group of bricks kept identical by
// two-phase commit with the library as coordinator. It adds hash tables to
// the config service, failure detector and transport below.
//
// The layer is, as every layer here: protocol cores without I/O
// (dpmap.go, maps.go: the maps and their encoding; participant.go: a
// replica's two-phase commit, termination and recovery rules;
// coordinator.go: the library's), a thin runtime (service.go: a node's
// brick; library.go: the library; admin.go: tables in the config service),
// a simulator with an independent oracle (sim_test.go), and the CLI
// (grove table) and benchmark (grove bench table). participant.go's doc
// comment states the rules and where they depart from the paper, and why.
package ddstable
