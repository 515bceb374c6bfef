"""engine-sim: a stand-in for one vLLM replica with a block-level prefix cache model."""
