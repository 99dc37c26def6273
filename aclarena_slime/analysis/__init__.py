"""Analysis of eval results: the forgetting matrix and its metrics, paper-style tables, plots, and
the token-entropy stability analysis."""
