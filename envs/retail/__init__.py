"""τ³-Retail environment plugin (tag ``retail``): tools, database, user simulator, reward; see README.md."""
