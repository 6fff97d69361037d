"""Packing a plan's documents into fixed-length sequences: the packer, its engines, its results, its shards."""
