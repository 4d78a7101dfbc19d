"""The image transform, the per-candidate pipeline with quarantine, and the dry-run check."""
