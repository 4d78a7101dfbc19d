"""Where images come from: scanning source layouts into a manifest, reading candidate bytes."""
