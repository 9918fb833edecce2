package btree

// FailForTest makes the server fail as a failed log would (the cache's
// sticky error, its leases still standing).
func (s *Server) FailForTest(err error) { s.cache.fail(err) }
