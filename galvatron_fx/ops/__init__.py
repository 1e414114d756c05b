"""The ops galvatron_fx adds to torch: DTensor sharding rules for ops that have none
(:mod:`.shardings`), attention with a trained bias (:mod:`.attention`), vocab-parallel
cross-entropy (:mod:`.vocab_parallel`)."""
