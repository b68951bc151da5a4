"""Server-rendered web pages (Jinja2, no build step): sign-in, device-login approval and
confirmation approval."""
