"""The search environment (Search-R1 protocol): env, retrievers, /retrieve server, rewards, data."""
