"""The native modules (C sources, their build and checks) and the thin wrappers both engines share."""
