"""Generated development data: photo-like sample datasets with planted defects."""
