"""Thin HTTP routers: parse, authorize through dependencies, call a service, wrap the envelope."""
