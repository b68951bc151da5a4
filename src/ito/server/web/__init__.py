"""Server-rendered web pages (Jinja2, no build step): sign-in, device-login approval,
confirmation approval and the run dashboard (its charts drawn as inline SVG)."""
