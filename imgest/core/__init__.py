"""Errors, paths, settings, progress, quarantine records and work-folder names shared by every step."""
