"""Report: the paper's tables and figures, reproduction.md and captions (no torch at import)."""
