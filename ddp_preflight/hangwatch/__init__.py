"""hangwatch: find the training ranks, sample them, and name a hang with its rank and line."""
