"""Import-only stand-ins for the smoke job's PYTHONPATH (see the parent package's docstring)."""
