"""The mix file, the user's front door: its schema, validation (file, line and field in every error) and loading."""
