"""Data import: store layout, writer, validation, importers and synthetic generators."""
