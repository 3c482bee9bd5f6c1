"""Model and plan files: the GGUF reader and its header check, the repack cache, safe YAML, atomic file writes."""
