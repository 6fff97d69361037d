"""What a build writes beside the contract's files: the build folder's map, the shard writer, stage commit records, the
Megatron-LM export."""
