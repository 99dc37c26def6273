"""A synthetic environment a tiny random model learns in CPU minutes: the local backend's proof of learning."""
