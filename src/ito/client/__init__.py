"""The canonical, credential-bearing client: configuration, secure manifest read, HTTP, CLI."""
