"""The sharding search: intra-layer ILP, inter-layer DP, pipeline partition, outer search."""
