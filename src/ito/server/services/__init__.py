"""The logic and the SQL, one module per resource; the caller passes the session in."""
