"""Policy models: preparation, batched inference backends and SFT."""
